//! Proposals: the authority half. A worker that holds a task asks for a change to one row of
//! a source its task projected for it (`task_propose`); this module decides whether it may
//! (the holder of a claimed task, in a room that is writable, admitted and not cancelled,
//! without break-glass, the change within the projection it was given) and journals what the
//! daemon did with it. Applying it to the live file is `room-exec`'s (`proposal`), handed in
//! by the server as a closure the engine runs under the room's lock: the engine itself
//! touches no project file.

use crate::event::EventBody;
use crate::principal::AgentCaller;
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::event::{ProposalRecord, TaskEvent};
use room_core::stage::{Proposal, Selection};
use room_core::{Code, Refusal, TaskStatus, Verb};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A proposal the engine admitted: what the server applies, and records afterwards. It is
/// also the outbox's intention (serialized before anything is applied).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admitted {
    pub id: String,
    pub room: String,
    pub task: String,
    pub actor: String,
    /// The project root, revalidated at admission.
    pub root: String,
    pub selection: Selection,
    pub proposal: Proposal,
    /// The proposing session's conversation key in the room (absent in intentions an
    /// earlier version wrote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_key: Option<String>,
}

/// The actor of a record the daemon writes on its own account (a recovered proposal): never
/// the worker's, so that the worker must read it before it acts again.
pub const DAEMON_ACTOR: &str = "room";

impl Engine {
    /// Admit `proposal` for `task` (see the module comment), have `apply` carry it out, and
    /// journal what it reports, all under the room's lock: a cancel, an admission change or a
    /// lapse of the claim either comes before the admission (and refuses it) or after the
    /// record, never between. `apply` returns the record of an applied change, or the
    /// refusal of one that changed nothing (then nothing is journaled).
    pub fn proposal_apply(
        &self,
        caller: &AgentCaller,
        task: &str,
        proposal: Proposal,
        apply: impl FnOnce(&Admitted) -> Outcome<ProposalRecord>,
    ) -> Outcome<(Admitted, Value)> {
        let p = self.authorize(caller, Verb::TaskPropose)?;
        let t = self.task_row(task)?;
        let (handle, _) = self.member_handle(&p, &t.room)?;
        let sel = room_core::stage::admit_proposal(&t.stage, &proposal)?.clone();
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let room = self.control().room(&h.name).map_err(store_err)?;
        if room.is_some_and(|r| r.cancelled) || self.control().break_glass().map_err(store_err)? {
            return Err(Refusal::new(
                Code::RoomAdmissionClosed,
                format!(
                    "room {} is cancelled or break-glass is engaged: no change is applied",
                    h.name
                ),
            )
            .detail(json!({"room": h.name})));
        }
        let t = self.task_row(task)?;
        if t.status != TaskStatus::Claimed || t.recipient.as_deref() != Some(p.name.as_str()) {
            return Err(Refusal::new(
                Code::TaskNotHeld,
                format!(
                    "task {task} is {} for {:?}: only the holder of its claim proposes changes",
                    t.status, t.recipient
                ),
            )
            .hint("claim the task first (task_claim)"));
        }
        let pid = t
            .project_id
            .as_deref()
            .expect("a task with selections belongs to a project (checked at creation)");
        let root = self.revalidate_project(pid)?.canonical_root;
        let conversation_key = self.sync_key(&p, &t.room)?.conversation_key;
        let a = Admitted {
            id: format!("prp_{}", self.env.entropy.hex(8)),
            room: t.room,
            task: t.id,
            actor: p.name,
            root,
            selection: sel,
            proposal,
            conversation_key: Some(conversation_key),
        };
        let rec = apply(&a)?;
        let out = self.commit_proposal(&mut h, &a, rec)?;
        Ok((a, out))
    }

    /// Journal what a start found of a proposal a crash left unrecorded. Authority is not
    /// asked again: the outcome happened and must be on record (a room that can no longer be
    /// written refuses, and the outbox keeps the intention for the next start).
    pub fn proposal_recovered(&self, a: &Admitted, rec: ProposalRecord) -> Outcome<Value> {
        assert!(rec.recovered, "only a recovery records without admission");
        let handle = self.room_handle(&a.room)?;
        let mut h = lock_room(&handle);
        self.commit_proposal(&mut h, a, rec)
    }

    fn commit_proposal(
        &self,
        h: &mut crate::room::RoomHandle,
        a: &Admitted,
        mut rec: ProposalRecord,
    ) -> Outcome<Value> {
        assert_eq!(rec.id, a.id, "a record names its own proposal");
        h.writable()?;
        rec.worker = Some(a.actor.clone());
        rec.conversation_key = a.conversation_key.clone();
        let te = TaskEvent {
            // a live record is the worker's act, answered in its own call; a recovered one
            // is the daemon's word the worker has not seen
            actor: if rec.recovered {
                DAEMON_ACTOR.into()
            } else {
                a.actor.clone()
            },
            action: format!("proposal_{}", rec.outcome),
            task: a.task.clone(),
            proposal: Some(Box::new(rec.clone())),
            ..TaskEvent::default()
        };
        let out = h.commit(self, vec![EventBody::Task(Box::new(te))], None)?;
        Ok(
            json!({"proposal": rec.id, "task": a.task, "path": rec.change.path,
            "key": rec.change.key, "outcome": rec.outcome, "code": rec.code,
            "from_version": rec.change.version, "to_version": rec.to_version,
            "before_sha256": rec.before_sha256, "after_sha256": rec.after_sha256,
            "recovered": rec.recovered, "worker": rec.worker, "event": out[0].id}),
        )
    }
}
