//! Dispatch revalidation. A queued permit is not authority: it is a proposal to deliver work
//! later under conditions that may have changed. Every queued permit is checked again, least
//! recently checked first, against the seed's five centres, in order:
//!
//! 1. integrity: schema, `binding_sha256` over the 18 fields, the queue key it is filed under
//!    (`wake_job_binding_changed`);
//! 2. room and recipient: the room exists and is not archived, recipient and sender are still
//!    members, the owner grant and the session are the sealed ones, no reset since
//!    (`wake_room_authority_changed`); the recipient is not revoked and its registration is the
//!    sealed one (`wake_recipient_registration_changed`);
//! 3. task: open or claimed, in this room and its project, valid ancestry, still owned by the
//!    sealed sender or delegated through it (`wake_task_authority_changed`);
//! 4. admission and control epoch (`wake_admission_closed`);
//! 5. the deadline: `created + deadline_ms` still ahead; queue time counts (`wake_job_expired`).
//!
//! A refused permit is dead-lettered with its code and message, never retried, and its
//! obligations stay open (a dead wake is not an answer). A permit that passes stays queued for a
//! launch (routes and adapters come later) or for its agent's own MCP session.

use crate::{Engine, Outcome, store_err};
use room_core::wake::{WAKE_SCHEMA, WakePermit, wake_path};
use room_core::{Code, Refusal, TaskStatus};
use room_store::control::{RoomRow, WakeRow};
use serde_json::{Value, json};

/// Permits one sweep revalidates.
pub const DISPATCH_BATCH_MAX: usize = 64;

fn refuse(code: Code, why: String) -> Refusal {
    Refusal::new(code, why)
}

impl Engine {
    /// The owner grant a permit of `room` seals: the project grant with its root identity, or
    /// the coordination room's own graph.
    pub(crate) fn room_grant(&self, room: &RoomRow) -> Outcome<String> {
        match &room.project_id {
            Some(pid) => {
                let p = self
                    .control()
                    .project(pid)
                    .map_err(store_err)?
                    .ok_or_else(|| refuse(Code::NotFound, format!("no project {pid}")))?;
                Ok(format!("project:{pid}@{}:{}:{}", p.dev, p.ino, p.mnt_id))
            }
            None => Ok(format!("coordination:{}", room.graph_id)),
        }
    }

    /// Revalidate up to `DISPATCH_BATCH_MAX` queued permits; dead-letter each that fails.
    /// Returns how many were checked and which died, with their codes.
    pub fn dispatch_sweep(&self) -> Outcome<Value> {
        self.flush_wakes();
        let rows = self
            .control()
            .wakes_to_check(DISPATCH_BATCH_MAX)
            .map_err(store_err)?;
        let now = self.now_ms();
        let mut dead = Vec::new();
        for w in &rows {
            let verdict = self.revalidate(w, now).err();
            let letter = verdict
                .as_ref()
                .map(|r| (r.code.as_str(), r.message.as_str()));
            let moved = self
                .control()
                .wake_checked(w, now, letter)
                .map_err(store_err)?;
            if let (Some(r), true) = (verdict, moved) {
                tracing::info!(
                    room = %w.room, agent = %w.agent, source = %w.source_event,
                    "wake dead-lettered: {r}"
                );
                dead.push(
                    json!({"path": wake_path(&w.room, &w.agent, &w.source_event),
                    "code": r.code, "reason": r.message}),
                );
            }
        }
        Ok(json!({"checked": rows.len(), "dead": dead}))
    }

    /// The five checks, in order; the permit when every one holds.
    pub fn revalidate(&self, w: &WakeRow, now_ms: u64) -> Result<WakePermit, Refusal> {
        let p = self.integrity(w)?;
        let room = self.room_authority(&p)?;
        self.task_authority(&p, &room)?;
        let epoch = self.control().control_epoch().map_err(store_err)?;
        if !room.admission_open || epoch != p.binding.control_epoch {
            return Err(refuse(
                Code::WakeAdmissionClosed,
                format!(
                    "room {} admission is {}; control epoch {} (sealed {})",
                    room.name,
                    if room.admission_open {
                        "open"
                    } else {
                        "closed"
                    },
                    epoch,
                    p.binding.control_epoch
                ),
            ));
        }
        let due = w.created_ms.saturating_add(p.binding.deadline_ms);
        if now_ms > due {
            return Err(refuse(
                Code::WakeJobExpired,
                format!(
                    "its deadline of {} ms from creation passed {} ms ago (queue time counts)",
                    p.binding.deadline_ms,
                    now_ms - due
                ),
            ));
        }
        Ok(p)
    }

    fn integrity(&self, w: &WakeRow) -> Result<WakePermit, Refusal> {
        let changed = |why: &str| refuse(Code::WakeJobBindingChanged, why.to_string());
        let p: WakePermit =
            serde_json::from_str(&w.permit).map_err(|_| changed("the permit is unreadable"))?;
        if p.binding.schema != WAKE_SCHEMA {
            return Err(changed("the permit's schema is not room-wake-job-v3"));
        }
        if !p.intact() {
            return Err(changed("binding_sha256 does not match the sealed fields"));
        }
        let b = &p.binding;
        if (b.room.as_str(), b.agent.as_str(), b.source_event.as_str())
            != (w.room.as_str(), w.agent.as_str(), w.source_event.as_str())
            || b.path != wake_path(&w.room, &w.agent, &w.source_event)
        {
            return Err(changed("the permit is filed under another key"));
        }
        Ok(p)
    }

    fn room_authority(&self, p: &WakePermit) -> Result<RoomRow, Refusal> {
        let b = &p.binding;
        let changed = |why: String| refuse(Code::WakeRoomAuthorityChanged, why);
        let room = self
            .control()
            .room(&b.room)
            .map_err(store_err)?
            .filter(|r| r.archived_ms.is_none())
            .ok_or_else(|| changed(format!("room {} is gone or archived", b.room)))?;
        for who in [&b.agent, &b.from] {
            if !self.control().is_member(&b.room, who).map_err(store_err)? {
                return Err(changed(format!(
                    "{who} is no longer a member of {}",
                    b.room
                )));
            }
        }
        let grant = self.room_grant(&room)?;
        let a = &b.room_authority;
        if a.owner_grant != grant
            || a.session != self.state.instance_id
            || a.reset_at != room.reset_ms.map(room_core::wake::rfc3339_ms)
        {
            return Err(changed(format!(
                "the room's grant, session or reset is not the sealed one (now {grant})"
            )));
        }
        let agent = self.control().agent(&b.agent).map_err(store_err)?;
        match agent {
            Some(r) if r.revoked_ms.is_none() && r.registration_sha256 == b.registration_sha256 => {
                Ok(room)
            }
            _ => Err(refuse(
                Code::WakeRecipientRegistrationChanged,
                format!(
                    "{} was revoked or re-registered since the permit was sealed",
                    b.agent
                ),
            )),
        }
    }

    fn task_authority(&self, p: &WakePermit, room: &RoomRow) -> Result<(), Refusal> {
        let b = &p.binding;
        let Some(task) = &b.task else {
            return Ok(());
        };
        let changed = |why: String| refuse(Code::WakeTaskAuthorityChanged, why);
        let t = self
            .control()
            .task(task)
            .map_err(store_err)?
            .ok_or_else(|| changed(format!("task {task} is gone")))?;
        if !matches!(t.status, TaskStatus::Open | TaskStatus::Claimed) {
            return Err(changed(format!("task {task} is {}", t.status)));
        }
        if t.room != room.name || t.project_id != room.project_id {
            return Err(changed(format!(
                "task {task} is not a task of room {} and its project",
                room.name
            )));
        }
        let ancestors = self
            .valid_ancestry(&t.id, t.parent.as_deref())
            .map_err(|r| changed(format!("its ancestry is invalid: {}", r.message)))?;
        let delegated = t.owner == b.from
            || t.recipient.as_deref() == Some(b.from.as_str())
            || ancestors.iter().any(|a| a.owner == b.from);
        if !delegated {
            return Err(changed(format!(
                "task {task} is no longer owned by {} nor delegated through it",
                b.from
            )));
        }
        Ok(())
    }
}
