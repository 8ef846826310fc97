//! Rooms, tasks and the nine contribution verbs. Every agent call authorizes first (credential,
//! tier, verb policy), then checks membership and territory, then passes the Work Gate. A turn
//! is prepared outside the room's writer lock and committed under it after rechecking the
//! frontier: a foreign event that arrived in between is `room_sync_concurrent_arrival`.

use crate::acceptance::{self, PreRun};
use crate::event::{
    Binding, BlobRef, Deliver, EventBody, ItemKind, ItemPlan, Resolution, TaskCreated, TaskEvent,
    TaskStatus, TaskTransition, Turn,
};
use crate::principal::{AgentCaller, Principal};
use crate::room::{RoomHandle, binding_of, graph_id};
use crate::sync::{GateRetry, Standing};
use crate::turnstile::{Admit, TurnStep, TurnWaits};
use crate::{Engine, Outcome, invariants, lock_room, store_err};
use room_core::acceptance::{Check, ReceiptProfile};
use room_core::wake::TASKED_DEADLINE_MS;
use room_core::{Code, GatedVerb, Refusal, Verb, id, name};
use room_store::blobs::INLINE_BYTES_MAX;
use room_store::control::{RoomRow, TaskRow};
use room_store::index::{CheckpointRow, ItemRow};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Longest task title.
pub const TITLE_BYTES_MAX: usize = 256;
const PREVIEW_CHARS: usize = 256;
const LOG_PAGE_MAX: usize = 1000;
/// Task ids `task_ids` lists at most.
pub const TASK_IDS_MAX: usize = 100;
/// Conversations of one member `room_members` shows at most.
pub const MEMBER_CONVERSATIONS_MAX: usize = 16;
/// How many causal links an audit walks.
const AUDIT_DEPTH_MAX: u32 = 1000;
/// Open mentions and obligations listed with each sync page, oldest first (the total is always
/// given). Each sync repeats them and a model reads every byte of a tool result, so the list is
/// what to answer next, not the whole inbox: answering the oldest brings the next ones up.
pub const OPEN_ITEMS_PAGE_MAX: usize = 8;

/// Arguments of a contribution verb, already decoded from the wire.
#[derive(Debug, Clone, Default)]
pub struct TurnArgs {
    pub room: String,
    pub text: Option<String>,
    pub to: Vec<String>,
    pub reply_to: Option<String>,
    pub task: Option<String>,
    pub evidence: Vec<String>,
    pub parents: Vec<String>,
    /// The obligation a `circle` re-raises.
    pub obligation: Option<String>,
    /// A self-identifying argument ("as"/"actor"): must name the caller.
    pub actor: Option<String>,
    /// `exactly_once`: a key this caller already used in this room is refused as a repeat.
    pub idempotency_key: Option<String>,
    /// The receipt of the page the caller has just read: confirmed in the turn's own commit
    /// (the gate runs on the position it establishes), so reading and acting take one call.
    pub read_through: Option<String>,
    /// Members who read the turn (its author always): empty for every reader. Narrowed by
    /// the audience of every parent (`visibility`).
    pub audience: Vec<String>,
    /// A blackboard write (a `note` only): the turn records this artifact version.
    pub artifact: Option<crate::blackboard::ArtifactDraft>,
}

/// Decode and check staging selections, naming the field of the first that is wrong.
fn parse_stage(raw: &[Value]) -> Outcome<Vec<room_core::stage::Selection>> {
    let list = raw
        .iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value(v.clone())
                .map_err(|e| Refusal::invalid(&format!("stage[{i}]"), e.to_string()))
        })
        .collect::<Outcome<Vec<_>>>()?;
    room_core::stage::validate(&list)?;
    Ok(list)
}

/// Arguments of `task_create`, already decoded from the wire.
#[derive(Debug, Clone, Default)]
pub struct TaskCreateArgs {
    pub room: String,
    pub title: String,
    pub to: Option<String>,
    pub parent: Option<String>,
    /// Typed scopes (`namespace:resource`) a claim of the task leases exclusively.
    pub scopes: Vec<String>,
    pub idempotency_key: Option<String>,
    /// What the work must achieve, in words.
    pub requirements: Vec<String>,
    /// Acceptance checks in the seed's shape, undecoded (decoding names each bad field).
    pub accept: Vec<Value>,
    /// The task only coordinates: it leases nothing, and neither may its subtasks.
    pub coordination_only: bool,
    /// Bound to its project's governing source (a subtask of a governed task always is).
    pub governed: bool,
    /// Staging selections, undecoded (decoding names each bad field).
    pub stage: Vec<Value>,
}

/// A turn that passed the gate and waits for its commit.
pub struct Prepared {
    principal: Principal,
    standing: Standing,
    handle: Arc<Mutex<RoomHandle>>,
    snapshot_seq: u64,
    turn: Turn,
    resolves: Vec<(ItemKind, String)>,
    /// The caller's checkpoint as stored, and the `read_through` receipt with its chain's
    /// length: what a refusal at commit serves the next page from.
    durable: Standing,
    read_through: Option<(String, usize)>,
    /// The turnstile key of a turn that holds its room's slot: once nothing can send the turn
    /// back, the slot passes on (see [`Engine::commit_turn`]).
    slot: Option<String>,
}

/// What every verb's plan reads: the room (under its writer lock), the caller, the turn's
/// arguments, the room's binding, the members its text mentions, and the time.
struct PlanCx<'a> {
    h: &'a RoomHandle,
    p: &'a Principal,
    args: &'a TurnArgs,
    binding: &'a Binding,
    mentioned: &'a [String],
    now: u64,
    /// `done`'s command checks, run before the transition.
    pre: Option<&'a PreRun>,
    /// The wake deadlines of the policy in force: (untasked, task-bound).
    deadlines_ms: (u64, u64),
}

impl PlanCx<'_> {
    /// The deadline a permit of this turn is sealed with.
    fn deadline_ms(&self, tasked: bool) -> u64 {
        if tasked {
            self.deadlines_ms.1
        } else {
            self.deadlines_ms.0
        }
    }

    /// How a notice reaches its recipients: it wakes them in a coordination room; in a
    /// project room (where waking is `send`'s) it is an inbox entry.
    fn notice(&self) -> Deliver {
        match self.binding {
            Binding::Coordination => Deliver::NOTIFY,
            Binding::Project { .. } => Deliver::INBOX,
        }
    }
}

/// The bytes of text a turn writes, inline or in a blob (what `bytes_per_minute` counts).
fn turn_bytes(t: &Turn) -> u64 {
    t.text.as_ref().map_or(0, |s| s.len() as u64) + t.text_blob.as_ref().map_or(0, |b| b.bytes)
}

fn member_refusal(agent: &str, room: &str) -> Refusal {
    Refusal::new(
        Code::RoomNotMember,
        format!("{agent} is not a member of room {room}"),
    )
    .hint(format!(
        "the owner can add it: `room members add {room} {agent}`"
    ))
}

fn mentions_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'@' && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric())) {
            let start = i + 1;
            let mut end = start;
            while end < bytes.len()
                && (bytes[end].is_ascii_lowercase()
                    || bytes[end].is_ascii_digit()
                    || b"-_.".contains(&bytes[end]))
            {
                end += 1;
            }
            let name = text[start..end].trim_end_matches('.');
            if !name.is_empty() {
                out.push(name.to_string());
            }
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

pub(crate) fn task_view(t: &TaskRow) -> Value {
    json!({"id": t.id, "room": t.room, "project": t.project_id, "title": t.title, "owner": t.owner,
        "recipient": t.recipient, "parent": t.parent, "status": t.status, "scopes": t.scopes,
        "requirements": t.requirements, "acceptance": t.acceptance, "revision": t.revision,
        "successor": t.successor, "acceptance_override": t.override_reason, "governed": t.governed})
}

impl Engine {
    // ---------- owner operations ----------

    pub fn room_create(
        &self,
        _owner: &crate::Owner,
        room: &str,
        project: Option<&str>,
        members: &[String],
    ) -> Outcome<Value> {
        name::validate("room", room)?;
        for m in members {
            name::validate("member", m)?;
        }
        if let Some(p) = project {
            if !id::is_project_id(p) {
                return Err(Refusal::invalid(
                    "project",
                    "not a project id (prj_ and 16 hex)",
                ));
            }
            self.revalidate_project(p)?;
        }
        let row = RoomRow {
            name: room.into(),
            graph_id: graph_id(&self.state.instance_id, room),
            project_id: project.map(String::from),
            created_ms: self.now_ms(),
            revision: 1,
            reset_gen: 0,
            reset_ms: None,
            admission_gen: 0,
            admission_open: true,
            archived_ms: None,
            cancel_gen: 0,
            cancelled: false,
        };
        // the shard, the control row and the handle appear together or not at all
        let _one_creation = self.rooms.creation_lock();
        {
            let c = self.control();
            if let Some(existing) = c.room(room).map_err(store_err)? {
                if existing.project_id != row.project_id {
                    return Err(Refusal::new(
                        Code::GraphProjectRebindRefused,
                        format!(
                            "room {room} is already bound to {:?}; a binding never changes",
                            binding_of(&existing)
                        ),
                    )
                    .hint("create a room with a new name"));
                }
                return Err(Refusal::new(
                    Code::AlreadyExists,
                    format!("room {room} already exists"),
                ));
            }
            for m in members {
                if c.agent(m).map_err(store_err)?.is_none() {
                    return Err(Refusal::invalid("member", format!("no agent named {m:?}")));
                }
            }
        }
        let body = EventBody::RoomCreated {
            actor: "owner".into(),
            room: room.into(),
            binding: binding_of(&row),
            members: members.to_vec(),
        };
        RoomHandle::create_shard(self, &row, body)?;
        // bound first: a guard in an `if let` scrutinee lives through its body, and the undo
        // takes the control store again (a failed insert deadlocked here)
        let inserted = self.control().insert_room(&row, members);
        if let Err(e) = inserted {
            self.undo_creation(&row);
            return Err(store_err(e));
        }
        let room_handle = match RoomHandle::open(self, &row) {
            Ok(h) => h,
            Err(e) => {
                self.undo_creation(&row);
                return Err(Refusal::storage(format!(
                    "room {room} was not created: opening it failed: {e}"
                )));
            }
        };
        self.keep_open(room, room_handle);
        Ok(
            json!({"room": room, "graph_id": row.graph_id, "binding": binding_of(&row), "members": members}),
        )
    }

    /// Nothing of a failed creation may stay: its control row goes, then its shard. When the
    /// row's removal fails too (it may or may not have been written), the shard stays, so that
    /// the room is whole if the row is there; the next start sets the shard aside if it is not.
    fn undo_creation(&self, row: &RoomRow) {
        let removed = self.control().remove_room(&row.name);
        match removed {
            Ok(_) => self.discard_shard(row),
            Err(e) => tracing::error!(
                room = %row.name,
                "a failed creation's row could not be removed; the next start decides: {e}"
            ),
        }
    }

    /// Set aside the shard of a creation that failed (logged: it is kept for inspection).
    fn discard_shard(&self, row: &RoomRow) {
        match self.rooms.store.set_aside(&row.graph_id, self.now_ms()) {
            Ok(to) => {
                tracing::warn!(room = %row.name, "a failed creation's shard is set aside at {to}")
            }
            Err(e) => {
                tracing::error!(room = %row.name, "setting aside a failed creation's shard: {e}")
            }
        }
    }

    /// Archive a room: read-only from now on (turns refused `room_archived`), its journal kept
    /// and verifiable, its handle closed so that it holds no descriptors until it is read.
    pub fn room_archive(&self, _owner: &crate::Owner, room: &str) -> Outcome<Value> {
        let handle = self.room_handle(room)?;
        {
            let mut h = lock_room(&handle);
            // a claim's lapse must still be recordable: an archived room takes no record
            let claimed = self.control().rooms_with_claims().map_err(store_err)?;
            if claimed.iter().any(|r| r == room) {
                return Err(Refusal::new(
                    Code::RoomArchiveRefused,
                    format!("room {room} has claimed tasks; it cannot be archived while work is under way"),
                )
                .hint("let the claimers finish (done, blocked, decline or handoff), then archive"));
            }
            // so must a running worker's stop (the observer journals it in this room)
            let live = self.control().launches_live().map_err(store_err)?;
            if live.iter().any(|l| l.room == room) {
                return Err(Refusal::new(
                    Code::RoomArchiveRefused,
                    format!(
                        "room {room} has workers running; it cannot be archived while they run"
                    ),
                )
                .hint(format!("stop them with `room cancel {room}`, then archive")));
            }
            h.index.flush().map_err(store_err)?;
            let changed = self
                .control()
                .archive_room(room, self.now_ms())
                .map_err(store_err)?;
            if !changed {
                return Err(Refusal::new(
                    Code::RoomArchived,
                    format!("room {room} is already archived"),
                ));
            }
            h.archived = true;
        }
        drop(handle);
        if let Some(h) = self.rooms.take_if_idle(room) {
            self.close_room_handle(&h);
        }
        Ok(json!({"room": room, "archived": true}))
    }

    pub fn room_members_add(
        &self,
        _owner: &crate::Owner,
        room: &str,
        agent: &str,
    ) -> Outcome<Value> {
        name::validate("agent", agent)?;
        let handle = self.room_handle(room)?;
        if self.control().agent(agent).map_err(store_err)?.is_none() {
            return Err(Refusal::new(
                Code::NotFound,
                format!("no agent named {agent:?}"),
            ));
        }
        let mut h = lock_room(&handle);
        h.writable()?;
        // The journal record is the change; control.db follows from it (at commit and at
        // catch-up), so the roster never changes without its event.
        let added = !self.control().is_member(room, agent).map_err(store_err)?;
        if added {
            h.commit(
                self,
                vec![EventBody::MemberAdded {
                    actor: "owner".into(),
                    agent: agent.into(),
                }],
                None,
            )?;
        }
        Ok(json!({"room": room, "agent": agent, "added": added}))
    }

    /// Reset a room's view: every checkpoint is invalidated and agents must sync again.
    pub fn room_reset(&self, c: &crate::lifecycle::Control, room: &str) -> Outcome<Value> {
        let handle = self.room_handle(room)?;
        let mut h = lock_room(&handle);
        h.writable()?;
        h.commit(
            self,
            vec![EventBody::RoomReset {
                actor: c.actor().into(),
            }],
            None,
        )?;
        Ok(json!({"room": room, "reset": true}))
    }

    /// Open or close a room's admission (the owner console): while closed no agent writes to
    /// it (`room_admission_closed`); reading goes on. Journaled, and a change moves the room's
    /// view, so every reader reads it again under the new admission.
    pub fn room_admission(
        &self,
        c: &crate::lifecycle::Control,
        room: &str,
        open: bool,
    ) -> Outcome<Value> {
        let handle = self.room_handle(room)?;
        let mut h = lock_room(&handle);
        h.writable()?;
        let now_open = self
            .control()
            .room(room)
            .map_err(store_err)?
            .is_some_and(|r| r.admission_open);
        if now_open == open {
            let state = if open { "open" } else { "closed" };
            return Err(Refusal::invalid(
                "open",
                format!("the admission of room {room} is already {state}"),
            ));
        }
        let rec = h.commit(
            self,
            vec![EventBody::Admission {
                actor: c.actor().into(),
                open,
            }],
            None,
        )?;
        Ok(
            json!({"room": room, "admission_open": open, "admission_gen": rec[0].seq,
            "event": rec[0].id}),
        )
    }

    /// An agent's write needs the room's admission open.
    pub(crate) fn admitted(&self, room: &str) -> Outcome<()> {
        let open = self
            .control()
            .room(room)
            .map_err(store_err)?
            .is_none_or(|r| r.admission_open);
        if open {
            return Ok(());
        }
        Err(Refusal::new(
            Code::RoomAdmissionClosed,
            format!("the admission of room {room} is closed: no agent writes to it now"),
        )
        .detail(json!({"room": room}))
        .hint("reading goes on; the owner reopens it with room admission ROOM --open"))
    }

    /// The audit path of the Work Gate: every causal ancestor of an event, walked with the
    /// recursive query over `causal_edges` (the gate itself needs only the watermark).
    pub fn room_audit(&self, _owner: &crate::Owner, room: &str, event: &str) -> Outcome<Value> {
        if !id::is_event_id(event) {
            return Err(Refusal::invalid("event", "not an event id (evt_…)"));
        }
        let handle = self.room_handle(room)?;
        let h = lock_room(&handle);
        h.readable()?;
        let e = h
            .index
            .event_by_id(event)
            .map_err(store_err)?
            .ok_or_else(|| {
                Refusal::new(
                    Code::NotFound,
                    format!("{event} is not an event of room {room}"),
                )
            })?;
        let ancestors = h
            .index
            .ancestors(event, AUDIT_DEPTH_MAX)
            .map_err(store_err)?;
        let mut rows = Vec::new();
        for a in &ancestors {
            if let Some(r) = h.index.event_by_id(a).map_err(store_err)? {
                rows.push(json!({"id": r.id, "seq": r.seq, "actor": r.actor, "kind": r.kind}));
            }
        }
        rows.sort_by_key(|r| r["seq"].as_u64());
        Ok(
            json!({"room": room, "event": {"id": e.id, "seq": e.seq, "actor": e.actor}, "ancestors": rows,
            "depth_max": AUDIT_DEPTH_MAX}),
        )
    }

    /// Every room, for the owner.
    pub fn rooms_view(&self, _owner: &crate::Owner) -> Outcome<Value> {
        let mut v = self.rooms_listing(None)?;
        let (open, open_max) = self.rooms.open_count();
        v["open_now"] = json!(open);
        v["open_max"] = json!(open_max);
        Ok(v)
    }

    /// A room's members and what each has confirmed: its position in each conversation it
    /// read in (newest first, at most `MEMBER_CONVERSATIONS_MAX`) and its lag behind the tip.
    pub fn room_members(&self, _owner: &crate::Owner, room: &str) -> Outcome<Value> {
        let members = self.control().members(room).map_err(store_err)?;
        let handle = self.room_handle(room)?;
        let h = lock_room(&handle);
        let tip = h.tip().seq;
        let mut out = Vec::new();
        for m in members {
            let cps = h
                .index
                .checkpoints_of(&m, MEMBER_CONVERSATIONS_MAX)
                .map_err(store_err)?;
            let confirmed = cps.iter().map(|c| c.confirmed_seq).max();
            out.push(json!({
                "agent": m,
                "confirmed_seq": confirmed,
                "lag": tip.saturating_sub(confirmed.unwrap_or(0)),
                "conversations": cps.iter().map(|c| json!({"conversation": c.conversation,
                    "confirmed_seq": c.confirmed_seq, "updated_ms": c.updated_ms})).collect::<Vec<_>>(),
            }));
        }
        Ok(json!({"room": room, "tip_seq": tip, "members": out}))
    }

    pub(crate) fn rooms_listing(&self, only_member: Option<&str>) -> Outcome<Value> {
        let rows = self.control().rooms().map_err(store_err)?;
        let unusable = self.rooms.unusable_all();
        let mut out = Vec::new();
        for r in rows {
            let members = self.control().members(&r.name).map_err(store_err)?;
            if only_member.is_some_and(|a| !members.iter().any(|m| m == a)) {
                continue;
            }
            let mut entry = json!({
                "room": r.name, "binding": binding_of(&r), "members": members,
                "archived": r.archived_ms.is_some(),
            });
            if let Some(why) = unusable.get(&r.name) {
                entry["unusable"] = json!(why);
                out.push(entry);
                continue;
            }
            let handle = self.room_handle(&r.name)?;
            let h = lock_room(&handle);
            entry["tip_seq"] = json!(h.tip().seq);
            entry["read_only"] = json!(h.read_only);
            entry["quarantined"] = json!(h.quarantine);
            out.push(entry);
        }
        Ok(json!({"rooms": out}))
    }

    /// The owner's unredacted view of a room's events.
    pub fn room_log(
        &self,
        _owner: &crate::Owner,
        room: &str,
        from_seq: u64,
        limit: usize,
    ) -> Outcome<Value> {
        let handle = self.room_handle(room)?;
        let h = lock_room(&handle);
        let rows = h
            .index
            .events_from(from_seq.max(1), limit.clamp(1, LOG_PAGE_MAX))
            .map_err(store_err)?;
        let events: Vec<Value> = rows
            .iter()
            .map(|e| {
                json!({"seq": e.seq, "id": e.id, "actor": e.actor, "kind": e.kind,
                    "hlc": format!("{}.{}", e.hlc_ms, e.hlc_c), "hash": e.hash,
                    "event": serde_json::from_str::<Value>(&e.body).unwrap_or(Value::Null)})
            })
            .collect();
        let items: Vec<Value> = ItemKind::ALL
            .into_iter()
            .flat_map(|k| h.index.items(k).unwrap_or_default())
            .map(|i| item_view(&i))
            .collect();
        Ok(json!({"room": room, "tip_seq": h.tip().seq, "events": events, "items": items}))
    }

    /// Rebuild a room's projection from its journal; receipts and checkpoints survive. Also
    /// the owner's way to accept a journal that reconciliation flagged as rotated. A journal
    /// that does not verify or lacks acknowledged records is refused `journal_loss_unaccepted`
    /// unless `accept_loss`: then the loss is recorded in the journal (`journal_loss`).
    pub fn index_rebuild(
        &self,
        _owner: &crate::Owner,
        room: &str,
        accept_loss: bool,
    ) -> Outcome<Value> {
        let handle = self.room_handle(room)?;
        // the rebuild forgets the room's leases and refills them: no claim of another room of
        // the project may check `exclusive` in between (lease lock before room lock, as claims)
        let _leases = self.rooms.lease_lock();
        let mut h = lock_room(&handle);
        // Accepting a replaced journal resets the room's view: checkpoints taken over the old
        // chain may point past or beside the new one, so every agent must read again.
        let was_rotated = h.rotated;
        let loss = h.rebuild_checked(self, accept_loss)?;
        let mut accepted = Value::Null;
        if let Some(l) = loss {
            // the loss is part of the journal from now on, and resets the view like a reset
            h.commit(
                self,
                vec![EventBody::JournalLoss {
                    actor: "owner".into(),
                    missing_from: l.from,
                    missing_to: l.to,
                    witnesses: l.witnesses.clone(),
                }],
                None,
            )?;
            accepted =
                json!({"missing_from": l.from, "missing_to": l.to, "witnesses": l.witnesses});
        } else if was_rotated {
            // recorded in the accepted journal itself, so the reset survives any later rebuild
            h.commit(
                self,
                vec![EventBody::RoomReset {
                    actor: "owner".into(),
                }],
                None,
            )?;
        }
        let count = h.index.event_count().map_err(store_err)?;
        Ok(
            json!({"room": room, "events": count, "tip_seq": h.tip().seq, "read_only": h.read_only,
            "loss_accepted": accepted}),
        )
    }

    // ---------- agent operations ----------

    pub(crate) fn member_handle(
        &self,
        p: &Principal,
        room: &str,
    ) -> Outcome<(Arc<Mutex<RoomHandle>>, Binding)> {
        name::validate("room", room)?;
        // the binding is immutable: kept beside the handle, so no call waits on the room's
        // lock (a busy room's fdatasync) to learn it
        let (handle, binding) = self.room_handle_bound(room)?;
        if !self.control().is_member(room, &p.name).map_err(store_err)? {
            return Err(member_refusal(&p.name, room));
        }
        if let Some(project) = binding.project() {
            self.revalidate_project(project)?;
        }
        Ok((handle, binding))
    }

    pub fn whoami(&self, caller: &AgentCaller) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::Whoami)?;
        let rooms = self.rooms_listing(Some(&p.name))?;
        let wakes = self.wakes_of(&p.name, &caller.token)?;
        Ok(
            json!({"agent": p.name, "tier": p.tier, "conversation": p.conversation,
            "registration_sha256": p.registration_sha256, "rooms": rooms["rooms"],
            "wakes": wakes, "scopes": p.scopes}),
        )
    }

    pub fn list(&self, caller: &AgentCaller) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::List)?;
        self.rooms_listing(Some(&p.name))
    }

    /// Ids of the tasks in the caller's rooms that start with `prefix` (at most
    /// `TASK_IDS_MAX`, and whether there are more): what a host completes a task argument
    /// from. A listing of what the caller may read anyway (its rooms' tasks); confirms nothing.
    pub fn task_ids(&self, caller: &AgentCaller, prefix: &str) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::List)?;
        if prefix.len() > name::NAME_BYTES_MAX || prefix.contains('\0') {
            return Err(Refusal::invalid(
                "prefix",
                format!("at most {} bytes of text", name::NAME_BYTES_MAX),
            ));
        }
        let rooms: Vec<String> = self.rooms_listing(Some(&p.name))?["rooms"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["room"].as_str().map(String::from))
            .collect();
        let mut ids = self
            .control()
            .task_ids_in(&rooms, prefix, TASK_IDS_MAX + 1)
            .map_err(store_err)?;
        let more = ids.len() > TASK_IDS_MAX;
        ids.truncate(TASK_IDS_MAX);
        Ok(json!({"tasks": ids, "more": more}))
    }

    /// Read the next page, optionally confirming a receipt first.
    pub fn sync(&self, caller: &AgentCaller, room: &str, confirm: Option<&str>) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::Sync)?;
        let (handle, _) = self.member_handle(&p, room)?;
        let key = self.sync_key(&p, room)?;
        let mut h = lock_room(&handle);
        h.readable()?;
        let mut st = self.standing(&h, key)?;
        let mut confirmed = Value::Null;
        if let Some(r) = confirm {
            st = self.confirm_receipt(&mut h, &st, r)?;
            confirmed = json!({"receipt": r, "confirmed_seq": st.pos.seq});
        }
        let mut page = self.serve_page(&mut h, &st, None)?;
        page["confirmed"] = confirmed;
        // Oldest first and bounded: the page budget must not be defeated by a flood of mentions.
        let (open, total) = h
            .index
            .open_items_page(&p.name, OPEN_ITEMS_PAGE_MAX)
            .map_err(store_err)?;
        page["open_items_total"] = json!(total);
        page["open_items"] = open.iter().map(open_item_view).collect();
        Ok(page)
    }

    pub fn task_create(&self, caller: &AgentCaller, a: TaskCreateArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::TaskCreate)?;
        let (room, title) = (a.room.as_str(), a.title.as_str());
        if title.trim().is_empty()
            || title.len() > TITLE_BYTES_MAX
            || title.chars().any(char::is_control)
        {
            return Err(Refusal::invalid(
                "title",
                format!("must be 1..={TITLE_BYTES_MAX} bytes without control characters"),
            ));
        }
        invariants::check_key(a.idempotency_key.as_deref())?;
        let mut scopes = invariants::parse_scopes(&a.scopes)?;
        room_core::acceptance::check_requirements(&a.requirements)?;
        let checks = room_core::acceptance::parse_list(&a.accept)?;
        let stage = parse_stage(&a.stage)?;
        let (handle, binding) = self.member_handle(&p, room)?;
        self.admit_checks(&checks, binding.project().is_some(), &scopes)?;
        if !stage.is_empty() && binding.project().is_none() {
            return Err(Refusal::invalid(
                "stage",
                "staging selects project files: only a task of a project room has them",
            ));
        }
        if a.coordination_only && !scopes.is_empty() {
            return Err(Refusal::invalid(
                "scopes",
                "a coordination-only task leases nothing: drop its scopes",
            ));
        }
        if let Some(pid) = binding.project() {
            let root = self.revalidate_project(pid)?.canonical_root;
            // leased as what each names in the project, whatever the spelling
            scopes = self.resolve_file_scopes(std::path::Path::new(&root), scopes)?;
            self.check_protected(std::path::Path::new(&root), &scopes)?;
        }
        if let Some(r) = &a.to {
            name::validate("to", r)?;
            if !self.control().is_member(room, r).map_err(store_err)? {
                return Err(Refusal::invalid(
                    "to",
                    format!("{r} is not a member of room {room}"),
                ));
            }
        }
        let mut governed = a.governed;
        let mut parent_revision = None;
        if let Some(parent) = &a.parent {
            if !id::is_task_id(parent) {
                return Err(Refusal::invalid("parent", "not a task id"));
            }
            let pt = self
                .control()
                .task(parent)
                .map_err(store_err)?
                .ok_or_else(|| Refusal::new(Code::TaskNotFound, format!("no task {parent}")))?;
            // a child lives beside its parent: the causal flag of the parent's done names the
            // children, which must not carry one room's tasks into another
            if pt.room != room {
                return Err(Refusal::invalid(
                    "parent",
                    format!(
                        "task {parent} belongs to another room; a subtask is created in its parent's room"
                    ),
                ));
            }
            self.valid_ancestry("(new)", Some(parent))?;
            self.check_delegation(&pt, &scopes, a.coordination_only)?;
            // a subtask keeps its ancestry's governing source
            governed |= pt.governed;
            parent_revision = Some(pt.revision);
        }
        if governed {
            let has_source = match binding.project() {
                Some(pid) => self.source_view(pid)?.is_some(),
                None => false,
            };
            if !has_source {
                return Err(Refusal::invalid(
                    "governed",
                    "only a task of a project with a governing source can be governed (room project source)",
                ));
            }
        }
        let task = id::task_id(self.env.entropy.as_ref());
        let te = TaskEvent {
            actor: p.name.clone(),
            action: "created".into(),
            task: task.clone(),
            created: Some(TaskCreated {
                title: title.into(),
                owner: p.name.clone(),
                recipient: a.to.clone(),
                parent: a.parent.clone(),
                project: binding.project().map(String::from),
                scopes,
                requirements: a.requirements.clone(),
                acceptance: checks,
                coordination_only: a.coordination_only,
                governed,
                parent_revision,
                stage,
            }),
            transition: None,
            idempotency_key: a.idempotency_key.clone(),
            ..TaskEvent::default()
        };
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let quotas = self.policy().quotas;
        let now = self.now_ms();
        // the title, the requirements and the checks are all text the room keeps
        let bytes = (title.len()
            + a.requirements.iter().map(String::len).sum::<usize>()
            + a.accept.iter().map(|c| c.to_string().len()).sum::<usize>()
            + a.stage.iter().map(|c| c.to_string().len()).sum::<usize>())
            as u64;
        h.check_bytes(&p.name, bytes, quotas.bytes_per_minute, now)?;
        let open = self
            .control()
            .tasks_open_count(room, &p.name)
            .map_err(store_err)?;
        if open >= quotas.tasks_open {
            return Err(crate::quota::exceeded(
                "tasks_open",
                quotas.tasks_open,
                open,
                1,
                format!(
                    "{} has {open} of {} tasks open in room {room}",
                    p.name, quotas.tasks_open
                ),
            ));
        }
        if let Err(v) = self.check_task_event(&h, &te, binding.project(), &[]) {
            return Err(self.refuse_check(&mut h, v));
        }
        let rec = h.commit(self, vec![EventBody::Task(Box::new(te))], None)?;
        h.record_bytes(&p.name, bytes, now);
        drop(h);
        let t = self
            .control()
            .task(&task)
            .map_err(store_err)?
            .expect("task projected by its commit");
        Ok(json!({"task": task_view(&t), "event": rec[0].id}))
    }

    pub(crate) fn task_row(&self, task: &str) -> Outcome<TaskRow> {
        if !id::is_task_id(task) {
            return Err(Refusal::invalid("task", "not a task id (tsk_ and 16 hex)"));
        }
        self.control()
            .task(task)
            .map_err(store_err)?
            .ok_or_else(|| Refusal::new(Code::TaskNotFound, format!("no task {task}")))
    }

    pub fn task_claim(
        &self,
        caller: &AgentCaller,
        task: &str,
        ttl_ms: Option<u64>,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::TaskClaim)?;
        invariants::check_ttl(ttl_ms)?;
        let t = self.task_row(task)?;
        let (handle, _) = self.member_handle(&p, &t.room)?;
        // scopes never change after creation, so whether the lease lock is needed is known now
        let mut leases = (!t.scopes.is_empty()).then(|| self.rooms.lease_lock());
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let t = self.task_row(task)?;
        // its holder claims a claimed task again to renew it (a fresh lease and a fresh
        // authority pin) when the claim lapsed or its terms or authority moved since
        let holder =
            t.status == TaskStatus::Claimed && t.recipient.as_deref() == Some(p.name.as_str());
        let renewal = holder
            && (h
                .index
                .lifecycle(&p.name, task)
                .map_err(store_err)?
                .is_some_and(|l| l.lapsed)
                || self.claim_moved(&t)?);
        // a blocked task is resumed by claiming it again
        if !(renewal || matches!(t.status, TaskStatus::Open | TaskStatus::Blocked))
            || t.recipient.as_deref().is_some_and(|r| r != p.name)
        {
            return Err(Refusal::new(
                Code::TaskStateInvalid,
                format!(
                    "task {task} is {} for {:?}; only its recipient can claim an open task",
                    t.status, t.recipient
                ),
            ));
        }
        let ancestors = self.valid_ancestry(task, t.parent.as_deref())?;
        let ttl_ms = ttl_ms.unwrap_or(TASKED_DEADLINE_MS);
        // under the lease lock: each generation is higher than every one issued before
        let lease_gen = match leases.as_deref_mut() {
            Some(last) => {
                let stored = self.control().lease_gen_max().map_err(store_err)?;
                *last = (*last).max(stored) + 1;
                Some(*last)
            }
            None => None,
        };
        let te = TaskEvent {
            actor: p.name.clone(),
            action: "claimed".into(),
            task: task.into(),
            created: None,
            transition: Some(moved(&t, TaskStatus::Claimed, &p.name)),
            idempotency_key: None,
            ttl_ms: Some(ttl_ms),
            lease_gen,
            authority: Some(self.authority_pin(&t, &ancestors, lease_gen)?),
            ..TaskEvent::default()
        };
        if let Err(v) = self.check_task_event(&h, &te, t.project_id.as_deref(), &t.scopes) {
            return Err(self.refuse_check(&mut h, v));
        }
        let rec = h.commit(self, vec![EventBody::Task(Box::new(te))], None)?;
        let t = self.task_row(task)?;
        let lease = lease_gen.map(|g| {
            json!({"generation": g, "scopes": t.scopes, "ttl_ms": ttl_ms,
                "expires_ms": rec[0].hlc.ms.saturating_add(ttl_ms)})
        });
        Ok(json!({"task": task_view(&t), "event": rec[0].id, "lease": lease}))
    }

    pub fn task_show(&self, caller: &AgentCaller, task: &str) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::TaskShow)?;
        let t = self.task_row(task)?;
        let (handle, _) = self.member_handle(&p, &t.room)?;
        let subs = self.submissions_view(&lock_room(&handle), &t.id)?;
        self.task_full_view(&t, subs)
    }

    /// The owner's view of a task.
    pub fn task_view_owner(&self, _owner: &crate::Owner, task: &str) -> Outcome<Value> {
        let t = self.task_row(task)?;
        let handle = self.room_handle(&t.room)?;
        let subs = self.submissions_view(&lock_room(&handle), &t.id)?;
        self.task_full_view(&t, subs)
    }

    /// A task with its lineage (ancestors nearest first, children), its lease and its newest
    /// acceptance evaluation.
    fn task_full_view(&self, t: &TaskRow, submissions: Value) -> Outcome<Value> {
        let mut ancestors = Vec::new();
        let mut next = t.parent.clone();
        let mut seen = BTreeSet::from([t.id.clone()]);
        while let Some(id) = next {
            if ancestors.len() >= crate::lineage::ANCESTRY_DEPTH_MAX || !seen.insert(id.clone()) {
                break;
            }
            let Some(a) = self.control().task(&id).map_err(store_err)? else {
                break;
            };
            ancestors.push(json!({"id": a.id, "status": a.status, "owner": a.owner,
                "recipient": a.recipient}));
            next = a.parent;
        }
        let children: Vec<Value> = self
            .control()
            .children(&t.id)
            .map_err(store_err)?
            .iter()
            .map(|c| json!({"id": c.id, "status": c.status, "recipient": c.recipient}))
            .collect();
        let lease = t.lease_held.then(|| {
            json!({"holder": t.recipient, "scopes": t.scopes, "generation": t.lease_gen,
                "since_ms": t.updated_ms})
        });
        let mut task = task_view(t);
        task["stage"] = json!(t.stage);
        Ok(json!({"task": task,
            "lineage": {"ancestors": ancestors, "children": children},
            "lease": lease,
            "submissions": submissions,
            "last_acceptance": self.last_evaluation(&t.id)?}))
    }

    /// Evaluate a task's checks without closing it (a dry run of `done`'s measurement): for
    /// its owner or its recipient. Writes nothing to the journal; the evaluation is kept as the
    /// task's newest.
    pub fn task_check(&self, caller: &AgentCaller, task: &str) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::TaskCheck)?;
        let t = self.task_row(task)?;
        self.member_handle(&p, &t.room)?;
        if t.owner != p.name && t.recipient.as_deref() != Some(p.name.as_str()) {
            return Err(Refusal::new(
                Code::TaskNotHeld,
                format!(
                    "task {task} is neither owned by nor addressed to {}",
                    p.name
                ),
            ));
        }
        self.evaluate_now(&t)
    }

    /// The owner's dry run of a task's checks.
    pub fn task_check_owner(&self, _owner: &crate::Owner, task: &str) -> Outcome<Value> {
        self.evaluate_now(&self.task_row(task)?)
    }

    fn evaluate_now(&self, t: &TaskRow) -> Outcome<Value> {
        let pre = self.pre_run_task(t)?;
        let handle = self.room_handle(&t.room)?;
        let ev = {
            let h = lock_room(&handle);
            h.readable()?;
            self.evaluate(t, Some(&pre), &h)?
        };
        self.record_evaluation(&ev)?;
        let mut v = ev.to_value();
        if t.acceptance.is_empty() {
            v["acceptance"] = json!("none_declared");
        }
        Ok(v)
    }

    /// A contribution verb, prepared and committed, outside the room's turnstile (for a caller
    /// that runs one turn at a time: the simulator, tests). Concurrent callers use
    /// [`Engine::turn_step`] or [`Engine::turn_waiting`].
    pub fn turn(&self, caller: &AgentCaller, verb: Verb, args: TurnArgs) -> Outcome<Value> {
        let prepared = self.prepare_turn(caller, verb, args)?;
        self.commit_turn(prepared)
    }

    /// A contribution verb through the room's turnstile (see `turnstile`): it runs now, or the
    /// answer is to wait for `ticket` (woken through [`Engine::turn_waits`]) or until
    /// `until_ms`, then call again with it. A turn that waited says so (`waited_ms`).
    pub fn turn_step(
        &self,
        caller: &AgentCaller,
        verb: Verb,
        args: TurnArgs,
        ticket: Option<u64>,
    ) -> Outcome<TurnStep<Value>> {
        let limits = self.policy().gate;
        if limits.turn_queue_max == 0 || !verb.is_gated() {
            return self.turn(caller, verb, args).map(TurnStep::Done);
        }
        let gated = verb
            .gated()
            .expect("only a gated verb goes through the turnstile");
        let p = self.authorize(caller, verb)?;
        let (handle, binding) = self.member_handle(&p, &args.room)?;
        let key = format!("{}\0{}", p.name, p.conversation);
        let admit =
            lock_room(&handle)
                .turnstile
                .admit(&key, ticket, self.now_ms(), &limits, || {
                    self.tickets
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                })?;
        let waited_ms = match admit {
            Admit::Wait { ticket, until_ms } => return Ok(TurnStep::Wait { ticket, until_ms }),
            Admit::Go { waited_ms } => waited_ms,
        };
        let read_forward = args.read_through.is_some();
        // authorized and found a member above, for this call: the turn goes on from there
        let out = self
            .check_actor(&p, args.actor.as_deref(), "actor")
            .and_then(|()| invariants::check_key(args.idempotency_key.as_deref()))
            .and_then(|()| self.prepare_as(gated, p, handle.clone(), binding, args))
            .and_then(|prep| {
                self.commit_turn(Prepared {
                    slot: Some(key.clone()),
                    ..prep
                })
            });
        let sent_back = out.as_ref().is_err_and(|r| {
            matches!(
                r.code,
                Code::RoomSyncRequired
                    | Code::RoomSyncViewChanged
                    | Code::RoomSyncConcurrentArrival
            )
        });
        let wake = lock_room(&handle).turnstile.finish(
            &key,
            sent_back,
            read_forward,
            self.now_ms(),
            &limits,
        );
        if let Some(t) = wake {
            self.turn_waits.wake(t);
        }
        out.map(|mut v| {
            if waited_ms > 0 {
                v["waited_ms"] = json!(waited_ms);
            }
            TurnStep::Done(v)
        })
        .map_err(|mut r| {
            if waited_ms > 0 {
                match &mut r.detail {
                    Value::Object(m) => {
                        m.insert("waited_ms".into(), json!(waited_ms));
                    }
                    d if d.is_null() => *d = json!({"waited_ms": waited_ms}),
                    _ => {}
                }
            }
            r
        })
    }

    /// [`Engine::turn_step`], waiting on this thread while the turn waits (bounded by
    /// `[gate] turn_wait_ms_max`).
    pub fn turn_waiting(&self, caller: &AgentCaller, verb: Verb, args: TurnArgs) -> Outcome<Value> {
        let mut ticket = None;
        loop {
            match self.turn_step(caller, verb, args.clone(), ticket)? {
                TurnStep::Done(v) => return Ok(v),
                TurnStep::Wait {
                    ticket: t,
                    until_ms,
                } => {
                    ticket = Some(t);
                    let left = until_ms.saturating_sub(self.now_ms()).max(1);
                    self.turn_waits
                        .wait_blocking(t, std::time::Duration::from_millis(left));
                }
            }
        }
    }

    /// Where a waiting turn learns that its ticket was woken.
    pub fn turn_waits(&self) -> &TurnWaits {
        &self.turn_waits
    }

    /// Phase 1: authorize, validate, pass the gate, plan. Holds the room lock only briefly.
    pub fn prepare_turn(
        &self,
        caller: &AgentCaller,
        verb: Verb,
        args: TurnArgs,
    ) -> Outcome<Prepared> {
        // Only a gated verb goes on (in the `else`, `verb` is still the one asked for).
        let Some(verb) = verb.gated() else {
            return Err(Refusal::invalid(
                "verb",
                format!("{verb} is not a contribution verb"),
            ));
        };
        let p = self.authorize(caller, verb.into())?;
        self.check_actor(&p, args.actor.as_deref(), "actor")?;
        invariants::check_key(args.idempotency_key.as_deref())?;
        let (handle, binding) = self.member_handle(&p, &args.room)?;
        self.prepare_as(verb, p, handle, binding, args)
    }

    /// [`Engine::prepare_turn`] for a caller already authorized as `p` and found a member of
    /// the room `handle` holds (a turn through the turnstile did both before its wait).
    fn prepare_as(
        &self,
        verb: GatedVerb,
        p: Principal,
        handle: Arc<Mutex<RoomHandle>>,
        binding: Binding,
        mut args: TurnArgs,
    ) -> Outcome<Prepared> {
        // a blackboard write is checked (fence, schema, version, limits) before anything else
        // of the turn, and stored only once every check of the turn has passed
        let artifact = match &args.artifact {
            None => None,
            Some(_) if verb != GatedVerb::Note => {
                return Err(Refusal::invalid(
                    "artifact",
                    format!("only a note carries an artifact, not {verb}"),
                ));
            }
            Some(d) => {
                let a = self.draft_artifact(&p, &args.room, &binding, d)?;
                // a reviewer's findings in a collaboration are addressed to its orchestrator
                // alone (the owner reads everything): no other reviewer reads them, and the
                // Work Gate never owes them to one (the panel's independence)
                if a.version.kind == "findings"
                    && let Some(orch) = self.collab_orchestrator_of(&args.room)?
                {
                    args.audience = vec![orch];
                }
                if args.text.is_none() {
                    args.text = Some(format!(
                        "{}/{}: version {}",
                        a.version.kind,
                        a.version.key,
                        a.expected_version.saturating_add(1)
                    ));
                }
                Some(a)
            }
        };
        let text = self.checked_text(verb, &args)?;
        // before the text can spill into a blob: a refused turn writes nothing (the commit
        // checks again under the writer lock, where it counts)
        if let Some(t) = &text {
            let limit = self.policy().quotas.bytes_per_minute;
            lock_room(&handle).check_bytes(&p.name, t.len() as u64, limit, self.now_ms())?;
        }
        // the list is bounded before anything looks at its entries (a repeated name counts:
        // 200,000 copies of one recipient are refused, not folded into one)
        if args.to.len() > self.config.recipients_max {
            return Err(Refusal::invalid(
                "to",
                format!(
                    "at most {} recipients, each named once ({} given)",
                    self.config.recipients_max,
                    args.to.len()
                ),
            ));
        }
        let members = self.control().members(&args.room).map_err(store_err)?;
        let mut recipients: BTreeSet<String> = BTreeSet::new();
        for (i, r) in args.to.iter().enumerate() {
            if recipients.contains(r) {
                return Err(Refusal::invalid(
                    &format!("to[{i}]"),
                    format!("{r} is named twice: name each recipient once"),
                ));
            }
            name::validate("to", r)?;
            if !members.contains(r) {
                return Err(Refusal::invalid(
                    "to",
                    format!("{r} is not a member of room {}", args.room),
                ));
            }
            if *r == p.name {
                return Err(Refusal::invalid("to", "you cannot address yourself"));
            }
            recipients.insert(r.clone());
        }
        let mentioned: Vec<String> = text
            .as_deref()
            .map(mentions_in)
            .unwrap_or_default()
            .into_iter()
            .filter(|m| members.contains(m) && *m != p.name)
            .collect();
        if recipients.len() + mentioned.len() > self.config.recipients_max {
            return Err(Refusal::invalid(
                "to",
                format!("at most {} recipients", self.config.recipients_max),
            ));
        }
        if args.parents.len() + args.evidence.len() > self.config.parents_max {
            return Err(Refusal::invalid(
                "parents",
                format!(
                    "at most {} parents and evidence handles",
                    self.config.parents_max
                ),
            ));
        }
        let asked = crate::visibility::asked(&args.audience, &p.name, &members, &args.room)?;
        let evidence_events = self.prevalidate_evidence(&args.room, &args.evidence, &p.name)?;
        let key = self.sync_key(&p, &args.room)?;
        let (text, text_blob) = self.spill_text(&handle, text)?;
        if let Some(a) = &artifact {
            self.store_artifact(&handle, a)?;
        }
        // long acceptance commands run here, before the transition and outside every lock
        let pre = match verb {
            GatedVerb::Done => self.pre_run(&p.name, &args.room, args.task.as_deref())?,
            _ => None,
        };
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        // A retry whose first call landed learns so before any other check can shadow it.
        if let Err(v) = self.check_exactly_once(
            &h,
            &p.name,
            verb.as_str(),
            args.idempotency_key.as_deref(),
            args.task.as_deref(),
        ) {
            return Err(self.refuse_check(&mut h, v));
        }
        let artifact = match &artifact {
            Some(a) => Some(self.version_artifact(&h, a)?),
            None => None,
        };
        let durable = self.standing(&h, key)?;
        let (standing, read_through) = match &args.read_through {
            Some(r) => {
                let (st, chain) = self.read_through(&h, &durable, r, "read_through")?;
                (st, Some((r.clone(), chain)))
            }
            None => (durable.clone(), None),
        };
        let mut parents: Vec<String> = args.parents.clone();
        parents.extend(evidence_events);
        if let Some(r) = &args.reply_to
            && id::is_event_id(r)
        {
            parents.push(r.clone());
        }
        let retry = GateRetry {
            durable: &durable,
            base: read_through.as_ref().map(|(r, n)| (r.as_str(), *n)),
        };
        self.gate(&mut h, &standing, &parents, &retry)?;
        recipients.extend(mentioned.iter().cloned());
        let mut turn = Turn {
            actor: p.name.clone(),
            verb: verb.into(),
            conversation_key: standing.key.conversation_key.clone(),
            view_gen: Some(standing.key.view_gen.clone()),
            text,
            text_blob,
            to: recipients.iter().cloned().collect(),
            reply_to: args.reply_to.clone(),
            parents: args.parents.clone(),
            task: args.task.clone(),
            evidence: args.evidence.clone(),
            resolves: vec![],
            plan: ItemPlan::default(),
            task_transition: None,
            detail: Value::Null,
            idempotency_key: args.idempotency_key.clone(),
            flags: Vec::new(),
            audience: Vec::new(),
            artifact,
        };
        // Identifiers the verb does not interpret itself must still name real things of this
        // room: they are stored with the turn and travel in wake permits.
        if let Some(r) = &args.reply_to
            && !matches!(verb, GatedVerb::Say | GatedVerb::Reply)
        {
            self.known_target(&h, r, &p.name)?;
        }
        if args.task.is_some()
            && matches!(verb, GatedVerb::Note | GatedVerb::Reply | GatedVerb::Circle)
        {
            self.require_task(&h, verb, &args)?;
        }
        let now = self.now_ms();
        let cx = PlanCx {
            h: &h,
            p: &p,
            args: &args,
            binding: &binding,
            mentioned: &mentioned,
            now,
            pre: pre.as_ref(),
            deadlines_ms: {
                let policy = self.policy();
                (policy.untasked_deadline_ms, policy.tasked_deadline_ms)
            },
        };
        self.plan_verb(verb, &cx, &mut turn)?;
        // once the verb has settled what the turn answers and resolves: those narrow it too
        turn.audience = crate::visibility::close(&h, &p.name, asked, &parents, &turn)?;
        crate::visibility::check_task_turn(&turn)?;
        crate::visibility::check_recipients(&turn.audience, &turn.to, &turn.plan)?;
        let resolves = turn
            .resolves
            .iter()
            .map(|r| (r.item, r.id.clone()))
            .collect();
        let snapshot_seq = h.tip().seq;
        drop(h);
        Ok(Prepared {
            principal: p,
            standing,
            handle,
            snapshot_seq,
            turn,
            resolves,
            durable,
            read_through,
            slot: None,
        })
    }

    /// Phase 2: under the room's writer lock, recheck the frontier and what the turn resolves,
    /// then flush 1 (the message) and flush 2 (its items and wakes).
    pub fn commit_turn(&self, prep: Prepared) -> Outcome<Value> {
        let Prepared {
            principal: p,
            standing,
            handle,
            snapshot_seq,
            turn,
            resolves,
            durable,
            read_through,
            slot,
        } = prep;
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        if !self
            .control()
            .is_member(&h.name, &p.name)
            .map_err(store_err)?
        {
            return Err(member_refusal(&p.name, &h.name));
        }
        if let Some(seq) = h
            .index
            .first_foreign_after(snapshot_seq, &p.name)
            .map_err(store_err)?
        {
            let retry = GateRetry {
                durable: &durable,
                base: read_through.as_ref().map(|(r, n)| (r.as_str(), *n)),
            };
            return Err(self.sync_refusal(
                &mut h,
                &standing,
                &retry,
                Code::RoomSyncConcurrentArrival,
                format!(
                    "event {seq} arrived while your turn was being prepared; nothing was written"
                ),
            ));
        }
        for (kind, item) in &resolves {
            let row = h.index.item(*kind, item).map_err(store_err)?;
            if row.is_none_or(|r| r.status != "open") {
                return Err(Refusal::new(
                    Code::RoomSyncConcurrentArrival,
                    format!("{item} was resolved concurrently; nothing was written"),
                ));
            }
        }
        if let Some(a) = &turn.artifact {
            self.recheck_artifact(&h, a)?;
        }
        if let Some(tr) = &turn.task_transition {
            let t = self.task_row(&tr.task)?;
            if t.status != tr.from {
                return Err(Refusal::new(
                    Code::RoomSyncConcurrentArrival,
                    format!(
                        "task {} changed to {} concurrently; nothing was written",
                        t.id, t.status
                    ),
                ));
            }
        }
        let bytes = turn_bytes(&turn);
        let now = self.now_ms();
        h.check_bytes(&p.name, bytes, self.policy().quotas.bytes_per_minute, now)?;
        let fold = CheckpointRow {
            actor: p.name.clone(),
            conversation: p.conversation.clone(),
            conversation_key: standing.key.conversation_key.clone(),
            view_gen: standing.key.view_gen.clone(),
            confirmed_seq: 0,
            chunk_seq: None,
            chunk_offset: 0,
            updated_ms: self.now_ms(),
        };
        // The Fold Rule: the author's position advances over its own turn only when no foreign
        // event lies between its checkpoint and the turn. The gate proved none up to the
        // snapshot and the check above proved none since, so no query is needed here.
        debug_assert!(
            h.index
                .first_foreign_after(standing.pos.seq, &p.name)
                .map_err(store_err)?
                .is_none(),
            "the gate and the commit check together cover the fold"
        );
        let fold = Some(fold);
        let planned = !turn.plan.is_empty();
        let mut turn = turn;
        let flags = match self.check_turn(&h, &turn) {
            Ok(flags) => flags,
            Err(mut v) => {
                // the record of a refused act says what it was: withheld wherever it would be
                if let crate::invariants::Check::Reject(r) = &mut v
                    && r.audience.is_empty()
                {
                    r.audience = turn.audience.clone();
                }
                return Err(self.refuse_check(&mut h, v));
            }
        };
        // A flag follows its act in the same batch, and completion after a crash looks at the
        // last record: a turn with a second flush carries none, and a turn carries one at most.
        assert!(
            flags.is_empty() || (!planned && flags.len() == 1),
            "only turns without items carry invariant flags, one at most"
        );
        turn.flags = flags.clone();
        let flag_views: Vec<Value> = flags
            .iter()
            .map(|f| json!({"invariant": f.invariant.as_str(), "severity": "flag", "detail": f.detail}))
            .collect();
        // Nothing can send this turn back now. The room's slot passes to the next waiting
        // turn, whose call (authorization, its own checks) overlaps this write: its gate runs
        // under this room's lock, so after this turn is in the index, and sees it.
        if let Some(t) = slot.and_then(|key| h.turnstile.pass_on(&key)) {
            self.turn_waits.wake(t);
        }
        let rec = h.commit_flagged(
            self,
            vec![EventBody::Turn(Box::new(turn.clone()))],
            if planned { None } else { fold.clone() },
            flags,
        )?;
        h.record_bytes(&p.name, bytes, now);
        let source = rec[0].id.clone();
        let items = if planned {
            match h.flush_items(self, &source, &turn, fold) {
                Ok(items) => Some(items),
                Err(r) => {
                    // Flush 1 is durable: the turn exists. Stop the room so that nothing lands
                    // after it; the next start completes its items from the journal.
                    h.halt(format!(
                        "turn {source} is durable but its items failed: {}",
                        r.message
                    ));
                    return Err(Refusal::storage(format!(
                        "turn {source} was written but its obligations and wakes are not yet: {}",
                        r.message
                    ))
                    .detail(json!({"journal_committed": true, "event": source}))
                    .hint("do not repeat the turn; a daemon restart completes it"));
                }
            }
        } else {
            None
        };
        let wakes: Vec<String> = items
            .as_ref()
            .map(|i| {
                i.wakes
                    .iter()
                    .map(|a| room_core::wake::wake_path(&h.name, a, &source))
                    .collect()
            })
            .unwrap_or_default();
        // a done's passing evaluation becomes the task's newest only once the done is durable:
        // a done refused after its plan (a concurrent arrival) leaves none that says passing
        if turn.detail["acceptance"] == "passed"
            && let Some(task) = &turn.task
        {
            // the done is durable: a failure to keep its observation is logged, not answered
            // as a refusal of a turn that was written
            let results = serde_json::from_value(turn.detail["acceptance_results"].clone())
                .map_err(|e| Refusal::storage(format!("a done's own results: {e}")));
            if let Err(r) = results.and_then(|acceptance_results| {
                self.record_evaluation(&room_core::acceptance::Evaluation {
                    task: task.clone(),
                    acceptance_pass: true,
                    acceptance_results,
                })
            }) {
                tracing::error!(task = %task, "the newest evaluation of a done task was not kept: {r}");
            }
        }
        Ok(json!({
            "room": h.name,
            "verb": turn.verb,
            "event": source,
            "seq": rec[0].seq,
            "mentions": items.as_ref().map(|i| i.mentions.iter().map(|m| json!({"id": m.id, "agent": m.agent})).collect::<Vec<_>>()).unwrap_or_default(),
            "obligations": items.as_ref().map(|i| i.obligations.iter().map(|m| json!({"id": m.id, "agent": m.agent})).collect::<Vec<_>>()).unwrap_or_default(),
            "wakes": wakes,
            "resolved": turn.resolves,
            "task": turn.task,
            "detail": turn.detail,
            "flags": flag_views,
            // who reads it: empty for every reader (what was asked, narrowed by its parents')
            "audience": turn.audience,
        }))
    }

    fn checked_text(&self, verb: GatedVerb, args: &TurnArgs) -> Outcome<Option<String>> {
        let needs_text = matches!(
            verb,
            GatedVerb::Note
                | GatedVerb::Say
                | GatedVerb::Reply
                | GatedVerb::Send
                | GatedVerb::Blocked
        );
        match &args.text {
            Some(t) if t.len() > self.config.text_bytes_max => Err(Refusal::new(
                Code::PayloadTooLarge,
                format!(
                    "text: {} bytes is over the {}-byte limit",
                    t.len(),
                    self.config.text_bytes_max
                ),
            )
            .detail(json!({"field": "text", "limit_bytes": self.config.text_bytes_max}))),
            Some(t) if t.contains('\0') => Err(Refusal::invalid("text", "contains NUL")),
            Some(t) if t.trim().is_empty() && needs_text => {
                Err(Refusal::invalid("text", "must not be empty"))
            }
            None if needs_text => Err(Refusal::invalid("text", format!("{verb} needs text"))),
            other => Ok(other.clone()),
        }
    }

    /// Text over 8 KiB goes to a blob (synced before the record that names it).
    fn spill_text(
        &self,
        handle: &Arc<Mutex<RoomHandle>>,
        text: Option<String>,
    ) -> Outcome<(Option<String>, Option<BlobRef>)> {
        match text {
            Some(t) if t.len() > INLINE_BYTES_MAX => {
                let blobs = lock_room(handle).blobs.clone();
                let sha = blobs.put(t.as_bytes(), "txt").map_err(Refusal::storage)?;
                let preview: String = t.chars().take(PREVIEW_CHARS).collect();
                Ok((
                    None,
                    Some(BlobRef {
                        sha256: sha,
                        bytes: t.len() as u64,
                        preview,
                    }),
                ))
            }
            other => Ok((other, None)),
        }
    }

    /// Every evidence handle must be an event of this room; one of another room is refused.
    /// Each cited piece of evidence is an event or an evidence handle of this room; returns
    /// the events they are (a handle's registration), which the turn takes as causal parents.
    /// The events `evidence` names for `reader` (a handle names the event that registered it):
    /// each of this room and read by `reader`; one withheld from it is refused exactly as one
    /// that does not exist.
    fn prevalidate_evidence(
        &self,
        room: &str,
        evidence: &[String],
        reader: &str,
    ) -> Outcome<Vec<String>> {
        let mut events = Vec::with_capacity(evidence.len());
        for ev in evidence {
            if id::is_evidence_id(ev) {
                events.push(self.evidence_here(room, ev, "evidence", reader)?);
                continue;
            }
            if !id::is_event_id(ev) {
                return Err(Refusal::invalid(
                    "evidence",
                    format!("{ev:?} is neither an event id nor an evidence handle (ev_)"),
                ));
            }
            events.push(ev.clone());
            let here = self.room_handle(room)?;
            let found = lock_room(&here).index.event_by_id(ev).map_err(store_err)?;
            match found {
                Some(e) if crate::visibility::reads(&e, reader)? => continue,
                // withheld: as if it did not exist (it is in no other room either)
                Some(_) => {
                    return Err(Refusal::invalid(
                        "evidence",
                        format!("{ev} is not an event of room {room}"),
                    ));
                }
                None => {}
            }
            let others = self.rooms.named();
            for (name, h) in others {
                if name == room {
                    continue;
                }
                // found there only if the reader reads it there: a withheld one does not exist
                let there = match lock_room(&h).index.event_by_id(ev).map_err(store_err)? {
                    Some(e) => crate::visibility::reads(&e, reader)?,
                    None => false,
                };
                if there {
                    return Err(Refusal::new(
                        Code::CrossRoomEvidenceRefused,
                        format!("evidence {ev} belongs to another room; evidence must come from room {room}"),
                    )
                    .detail(json!({"evidence": ev})));
                }
            }
            return Err(Refusal::invalid(
                "evidence",
                format!("{ev} is not an event of room {room}"),
            ));
        }
        Ok(events)
    }

    fn require_task(&self, h: &RoomHandle, verb: GatedVerb, args: &TurnArgs) -> Outcome<TaskRow> {
        let task = args.task.as_deref().ok_or_else(|| {
            Refusal::new(Code::TaskRequired, format!("{verb} needs a task"))
                .detail(json!({"field": "task"}))
        })?;
        let t = self.task_row(task)?;
        if t.room != h.name {
            return Err(Refusal::invalid(
                "task",
                format!("task {task} belongs to room {}", t.room),
            ));
        }
        Ok(t)
    }

    /// Each verb's rule (DESIGN §6), one function each.
    fn plan_verb(&self, verb: GatedVerb, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        match verb {
            GatedVerb::Note => self.plan_note(cx, turn),
            GatedVerb::Say => self.plan_say(cx, turn),
            GatedVerb::Reply => self.plan_reply(cx, turn),
            GatedVerb::Send => self.plan_send(cx, turn),
            GatedVerb::Done => self.plan_done(cx, turn),
            GatedVerb::Blocked => self.plan_blocked(cx, turn),
            GatedVerb::Decline => self.plan_decline(cx, turn),
            GatedVerb::Handoff => self.plan_handoff(cx, turn),
            GatedVerb::Circle => self.plan_circle(cx, turn),
        }
    }

    /// `note`: status telemetry. It addresses no one, and a visible @mention is refused.
    fn plan_note(&self, cx: &PlanCx<'_>, _turn: &mut Turn) -> Outcome<()> {
        if !cx.mentioned.is_empty() && !crate::planted::bug("04-C06") {
            return Err(Refusal::new(
                Code::NoteMentionsRefused,
                format!("a note cannot mention anyone ({})", cx.mentioned.join(", ")),
            )
            .hint("use say or send to address someone"));
        }
        if !cx.args.to.is_empty() {
            return Err(Refusal::invalid("to", "a note addresses no one"));
        }
        Ok(())
    }

    /// `say`: carries no task. An explicit `reply_to` resolves what its target holds for the
    /// caller; an untargeted say to no one answers the caller's one open source (from more
    /// than one it is ambiguous). It wakes its recipients in coordination rooms only.
    fn plan_say(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        if cx.args.task.is_some() {
            return Err(
                Refusal::new(Code::SayTaskRefused, "say does not carry a task")
                    .hint("use send for task-bound work"),
            );
        }
        let me = cx.p.name.as_str();
        if let Some(r) = &cx.args.reply_to {
            self.known_target(cx.h, r, &cx.p.name)?;
            turn.resolves = resolutions(&open_items_named(cx.h, me, r)?, "resolved");
        } else if turn.to.is_empty()
            && let Some(source) = only_open_source(cx.h, me)?
        {
            turn.resolves = resolutions(&open_items_named(cx.h, me, &source)?, "resolved");
            turn.reply_to = Some(source);
        }
        turn.plan = ItemPlan::to(&turn.to, cx.notice(), cx.now, cx.deadline_ms(false));
        Ok(())
    }

    /// `reply`: answers a mention or obligation addressed to the caller (named by its id or
    /// its source event). Wakes no one.
    fn plan_reply(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        let target = cx.args.reply_to.as_deref().ok_or_else(|| {
            Refusal::invalid("reply_to", "reply needs reply_to (an event or item id)")
        })?;
        self.known_target(cx.h, target, &cx.p.name)?;
        let hits = open_items_named(cx.h, &cx.p.name, target)?;
        if hits.is_empty() {
            return Err(Refusal::new(
                Code::ReplyTargetNotAddressed,
                format!("{target} holds nothing open addressed to {}", cx.p.name),
            )
            .hint("reply to a mention or obligation that is yours (see open_items in sync)"));
        }
        turn.resolves = resolutions(&hits, "resolved");
        Ok(())
    }

    /// `send`: an assignment (mention, obligation, wake) to each recipient. A project room
    /// needs a task, and a task must not be settled.
    fn plan_send(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        let tasked = match (&cx.args.task, cx.binding) {
            (None, Binding::Project { .. }) => {
                return Err(Refusal::new(
                    Code::SendTaskRequired,
                    "send in a project room needs a task",
                )
                .detail(json!({"field": "task"}))
                .hint("create one with task_create, then send --task"));
            }
            (None, Binding::Coordination) => false,
            (Some(_), _) => {
                let t = self.require_task(cx.h, GatedVerb::Send, cx.args)?;
                if !LIVE.contains(&t.status) {
                    return Err(task_state_invalid(&t, ""));
                }
                true
            }
        };
        if turn.to.is_empty() {
            return Err(Refusal::invalid(
                "to",
                "send needs at least one recipient (--to or @mention)",
            ));
        }
        let deadline = cx.deadline_ms(tasked);
        turn.plan = ItemPlan::to(&turn.to, Deliver::ASSIGN, cx.now, deadline);
        Ok(())
    }

    /// `handoff`: the task goes back to open for exactly one new recipient, who gets it in its
    /// inbox (a wake in coordination rooms). No lease moves: the new recipient must claim.
    fn plan_handoff(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        let t = self.held_task(GatedVerb::Handoff, cx, LIVE)?;
        let [to] = turn.to.as_slice() else {
            return Err(Refusal::invalid(
                "to",
                "handoff needs exactly one new recipient",
            ));
        };
        let to = to.clone();
        turn.task_transition = Some(moved(&t, TaskStatus::Open, &to));
        turn.detail = json!({"lease_transferred": false, "fresh_claim_required": true, "from": cx.p.name, "to": to});
        turn.plan = ItemPlan::to(
            std::slice::from_ref(&to),
            cx.notice(),
            cx.now,
            cx.deadline_ms(true),
        );
        Ok(())
    }

    /// `done`: the caller's claimed task closes only on measurement. Its checks are evaluated
    /// here, inside the transition (commands ran just before it); a failing one refuses with
    /// the evaluation. Only a passing evaluation resolves the caller's obligations on the task:
    /// a task that declares no checks closes on the caller's word and resolves nothing, and a
    /// task with requirements cannot close without checks.
    fn plan_done(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        let t = self.held_task(GatedVerb::Done, cx, &[TaskStatus::Claimed])?;
        let ancestors = self.valid_ancestry(&t.id, t.parent.as_deref())?;
        if !t.scopes.is_empty() && !t.lease_held {
            return Err(Refusal::new(
                Code::TaskStateInvalid,
                format!(
                    "the lease of task {} (generation {}) lapsed and was released; its scopes may have changed hands",
                    t.id,
                    t.lease_gen.unwrap_or(0)
                ),
            )
            .detail(json!({"task": t.id, "lease_generation": t.lease_gen, "fresh_claim_required": true}))
            .hint("claim the task again (a fresh lease), check the work, then done"));
        }
        if !self.config.skip_authority_pins {
            self.require_pinned_authority(&t, &ancestors)?;
        }
        let quarantined = self.quarantined(cx.h, &t.id)?;
        if !quarantined.is_empty() {
            return Err(Refusal::new(
                Code::ContentMismatch,
                format!(
                    "task {}: {} evidence in quarantine, its file changed since it was registered",
                    t.id,
                    quarantined.len()
                ),
            )
            .detail(json!({"task": t.id, "quarantined": quarantined}))
            .hint("restore the file, or register the evidence again for its current content"));
        }
        turn.task_transition = Some(moved(&t, TaskStatus::Done, &cx.p.name));
        let coverage = if t.governed {
            let since =
                cx.h.index
                    .lifecycle(&cx.p.name, &t.id)
                    .map_err(store_err)?
                    .map_or(t.updated_ms, |l| l.began_ms);
            Some(self.require_coverage(cx.h, cx.p, &t, since)?)
        } else {
            None
        };
        if t.acceptance.is_empty() {
            if let Some(reason) = &t.override_reason {
                let (from, carried) = self.carried_items(cx.h, &t)?;
                turn.resolves = self.proven_items(cx, &t, carried)?;
                turn.detail = json!({"acceptance": "operator_override", "override_reason": reason,
                    "acceptance_results": [], "obligations_resolved": true,
                    "verified_successor_of": from});
                return Ok(());
            }
            if !t.requirements.is_empty() || t.governed {
                return Err(Refusal::new(
                    Code::TaskAcceptanceRequired,
                    format!(
                        "task {} states {} requirements{} and declares no acceptance checks; it cannot close on a word",
                        t.id,
                        t.requirements.len(),
                        if t.governed { " and a governing source" } else { "" }
                    ),
                )
                .detail(json!({"task": t.id, "requirements": t.requirements}))
                .hint("the owner adds checks that measure the requirements (task amend --accept), or an operator records an override with its reason (room task override)"));
            }
            turn.detail = json!({"acceptance": "none_declared", "acceptance_results": [],
                "obligations_resolved": false});
            return Ok(());
        }
        let ev = self.evaluate(&t, cx.pre, cx.h)?;
        if !ev.acceptance_pass {
            // a failing one is the newest evaluation now; a passing one only with its commit
            self.record_evaluation(&ev)?;
            return Err(acceptance::failed(&ev));
        }
        let (from, mut carried) = self.carried_items(cx.h, &t)?;
        // a successor's acknowledgment of a historical result never stands for the return the
        // original task owed: its obligations stay open for the owner
        let kept =
            if t.acceptance.iter().any(
                |c| matches!(c, Check::WorkerReceipt(r) if r.profile == ReceiptProfile::Successor),
            ) {
                std::mem::take(&mut carried).len()
            } else {
                0
            };
        turn.resolves = self.proven_items(cx, &t, carried)?;
        turn.detail = json!({"acceptance": "passed", "acceptance_pass": true,
            "acceptance_results": ev.acceptance_results, "obligations_resolved": true,
            "verified_successor_of": from, "source_coverage": coverage});
        if kept > 0 {
            turn.detail["original_obligations_kept"] = json!(kept);
        }
        Ok(())
    }

    /// What a proven `done` resolves: the caller's obligations on the task and those its
    /// verified successorship carries.
    fn proven_items(
        &self,
        cx: &PlanCx<'_>,
        t: &TaskRow,
        carried: Vec<ItemRow>,
    ) -> Outcome<Vec<Resolution>> {
        let mut hits =
            cx.h.index
                .open_items_for_task(&cx.p.name, &t.id)
                .map_err(store_err)?;
        hits.retain(|i| i.kind == ItemKind::Obligation);
        hits.extend(carried);
        Ok(resolutions(&hits, "resolved"))
    }

    /// `blocked`: the caller's task is blocked; its owner gets an obligation to answer.
    fn plan_blocked(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        let open_or_claimed = [TaskStatus::Open, TaskStatus::Claimed];
        let t = self.held_task(GatedVerb::Blocked, cx, &open_or_claimed)?;
        turn.task_transition = Some(moved(&t, TaskStatus::Blocked, &cx.p.name));
        tell_owner(cx, &t, Deliver::ASSIGN, turn);
        Ok(())
    }

    /// `decline`: the caller refuses the task addressed to it; its items on the task resolve
    /// as declined (never as done) and the owner is notified.
    fn plan_decline(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        let t = self.held_task(GatedVerb::Decline, cx, LIVE)?;
        let hits =
            cx.h.index
                .open_items_for_task(&cx.p.name, &t.id)
                .map_err(store_err)?;
        turn.resolves = resolutions(&hits, "declined");
        turn.task_transition = Some(moved(&t, TaskStatus::Declined, &cx.p.name));
        tell_owner(cx, &t, Deliver::NOTIFY, turn);
        Ok(())
    }

    /// `circle`: re-raises an open obligation the caller raised, waking its addressee under
    /// the original deadline.
    fn plan_circle(&self, cx: &PlanCx<'_>, turn: &mut Turn) -> Outcome<()> {
        let ob = cx.args.obligation.as_deref().ok_or_else(|| {
            Refusal::invalid("obligation", "circle needs the obligation id it re-raises")
        })?;
        if !id::is_obligation_id(ob) {
            return Err(Refusal::invalid(
                "obligation",
                "not an obligation id (obl_ and 16 hex)",
            ));
        }
        let row =
            cx.h.index
                .item(ItemKind::Obligation, ob)
                .map_err(store_err)?;
        let row = match row {
            Some(r) if r.from_agent == cx.p.name && r.status == "open" => r,
            _ => {
                return Err(Refusal::new(
                    Code::ObligationNotFound,
                    format!("{ob} is not an open obligation you raised in this room"),
                ));
            }
        };
        turn.to = vec![row.agent.clone()];
        turn.reply_to = Some(row.source.clone());
        turn.task = row.task.clone();
        let not_after = row.not_after_ms.unwrap_or(cx.now);
        turn.detail = json!({"obligation": ob, "original_not_after_ms": not_after});
        turn.plan = ItemPlan {
            mention: vec![],
            oblige: vec![],
            wake: vec![row.agent.clone()],
            not_after_ms: not_after,
            deadline_ms: cx.deadline_ms(row.task.is_some()),
        };
        Ok(())
    }

    /// The turn's task, held by the caller and in one of `from`: what every verb that moves a
    /// task checks first (done, blocked, decline, handoff). The holder is the task's
    /// recipient; a handoff may also come from its owner.
    fn held_task(&self, verb: GatedVerb, cx: &PlanCx<'_>, from: &[TaskStatus]) -> Outcome<TaskRow> {
        let t = self.require_task(cx.h, verb, cx.args)?;
        let me = cx.p.name.as_str();
        let holds =
            t.recipient.as_deref() == Some(me) || (verb == GatedVerb::Handoff && t.owner == me);
        if !holds {
            let why = match verb {
                GatedVerb::Handoff => format!("task {} is not yours to hand off", t.id),
                GatedVerb::Decline => format!("task {} is not addressed to {me}", t.id),
                _ => format!("task {} is not held by {me}", t.id),
            };
            return Err(Refusal::new(Code::TaskNotHeld, why));
        }
        if !from.contains(&t.status) {
            let then = if verb == GatedVerb::Done {
                "; claim it before done"
            } else {
                ""
            };
            return Err(task_state_invalid(&t, then));
        }
        Ok(t)
    }

    /// A reply target must be an event or item of this room.
    /// `target` names an event of this room, or a mention or obligation of it, that `reader`
    /// reads (one withheld from it, or raised by an event withheld from it, is refused exactly
    /// as one that does not exist).
    fn known_target(&self, h: &RoomHandle, target: &str, reader: &str) -> Outcome<()> {
        let readable = |event: &str| -> Outcome<bool> {
            match h.index.event_by_id(event).map_err(store_err)? {
                Some(e) => crate::visibility::reads(&e, reader),
                None => Ok(false),
            }
        };
        let item = |kind: ItemKind| -> Outcome<bool> {
            match h.index.item(kind, target).map_err(store_err)? {
                Some(i) => readable(&i.source),
                None => Ok(false),
            }
        };
        let known = if id::is_event_id(target) {
            readable(target)?
        } else if id::is_mention_id(target) {
            item(ItemKind::Mention)?
        } else if id::is_obligation_id(target) {
            item(ItemKind::Obligation)?
        } else {
            return Err(Refusal::invalid(
                "reply_to",
                "not an event, mention or obligation id",
            ));
        };
        if !known {
            return Err(Refusal::invalid(
                "reply_to",
                format!("{target} is not in room {}", h.name),
            ));
        }
        Ok(())
    }
}

/// An open item as a sync page lists it: without what every listed item shares (addressed to
/// the reader, open, resolved by nothing).
pub fn open_item_view(i: &ItemRow) -> Value {
    debug_assert!(
        i.status == "open",
        "only open items are listed in a sync page"
    );
    json!({"id": i.id, "kind": i.kind.as_str(),
        "source": i.source, "from": i.from_agent, "task": i.task, "not_after_ms": i.not_after_ms})
}

/// The open items addressed to `agent` that `target` names: the item with that id, or the ones
/// its source event holds for `agent` (at most one of each kind, since an item's id derives from
/// its source and addressee). Four primary-key reads, however many items are open.
fn open_items_named(h: &RoomHandle, agent: &str, target: &str) -> Outcome<Vec<ItemRow>> {
    let mut out: Vec<ItemRow> = Vec::new();
    for kind in ItemKind::ALL {
        for id in [
            target.to_string(),
            crate::event::item_id(kind.prefix(), target, agent),
        ] {
            if let Some(i) = h.index.item(kind, &id).map_err(store_err)?
                && i.agent == agent
                && i.status == "open"
            {
                out.push(i);
            }
        }
    }
    out.sort_by_key(|i| i.source_seq);
    Ok(out)
}

/// The statuses a verb can still move a task from: every one but done and declined.
const LIVE: &[TaskStatus] = &[TaskStatus::Open, TaskStatus::Claimed, TaskStatus::Blocked];

/// The compare-and-set that moves `t` from the status it was read in to `to`, for `recipient`.
fn moved(t: &TaskRow, to: TaskStatus, recipient: &str) -> TaskTransition {
    TaskTransition {
        task: t.id.clone(),
        from: t.status,
        to,
        recipient: Some(recipient.into()),
    }
}

fn task_state_invalid(t: &TaskRow, then: &str) -> Refusal {
    Refusal::new(
        Code::TaskStateInvalid,
        format!("task {} is {}{then}", t.id, t.status),
    )
}

/// A task's owner hears of what its recipient did to it (unless they are one agent).
fn tell_owner(cx: &PlanCx<'_>, t: &TaskRow, what: Deliver, turn: &mut Turn) {
    if t.owner != cx.p.name {
        turn.to = vec![t.owner.clone()];
        turn.plan = ItemPlan::to(
            std::slice::from_ref(&t.owner),
            what,
            cx.now,
            cx.deadline_ms(true),
        );
    }
}

/// The verbs that answer or settle items read only the items they name: by id (an item's id
/// derives from its source and addressee), by task, or the oldest sources.
fn resolutions(items: &[ItemRow], status: &str) -> Vec<Resolution> {
    items
        .iter()
        .map(|i| Resolution {
            id: i.id.clone(),
            item: i.kind,
            status: status.into(),
        })
        .collect()
}

/// The one source the open items addressed to `agent` come from, if any. Items from more
/// than one source make an untargeted say ambiguous: `say_reply_target_ambiguous`, before
/// anything is written.
fn only_open_source(h: &RoomHandle, agent: &str) -> Outcome<Option<String>> {
    let mut sources = h
        .index
        .open_sources(agent, OPEN_ITEMS_PAGE_MAX + 1)
        .map_err(store_err)?;
    if sources.len() > 1 {
        let truncated = sources.len() > OPEN_ITEMS_PAGE_MAX;
        sources.truncate(OPEN_ITEMS_PAGE_MAX);
        let how_many = if truncated {
            format!("more than {OPEN_ITEMS_PAGE_MAX}")
        } else {
            sources.len().to_string()
        };
        return Err(Refusal::new(
            Code::SayReplyTargetAmbiguous,
            format!("you have open items from {how_many} sources; say which one you answer"),
        )
        .detail(json!({"sources": sources, "sources_truncated": truncated}))
        .hint("pass --reply-to EVENT, or address someone with --to"));
    }
    Ok(sources.pop())
}

pub fn item_view(i: &ItemRow) -> Value {
    json!({"id": i.id, "kind": i.kind.as_str(),
        "source": i.source, "agent": i.agent, "from": i.from_agent, "task": i.task, "status": i.status,
        "resolved_by": i.resolved_by, "not_after_ms": i.not_after_ms})
}
