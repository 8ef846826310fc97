//! Completion's authority. A claim pins the task's fourteen authority keys (the seed's list) and
//! `done` requires every one unchanged: a task whose terms, room epoch, project root, lineage
//! or lease moved under its worker closes only after a fresh claim. Here too are the three
//! ways a task's terms change after creation, each a journaled task event: the owner's
//! amendment, an operator's acceptance override (recorded with its reason), and supersession by
//! a verified successor, whose passing `done` carries the superseded task's obligations.

use crate::principal::AgentCaller;
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::acceptance::Check;
use room_core::canon::digest_of;
use room_core::event::{EventBody, Resolution, TaskEvent, TaskTerms, TaskTransition};
use room_core::scope::Scope;
use room_core::{Code, Refusal, TaskStatus, Verb};
use room_store::control::TaskRow;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The keys a claim pins, in the seed's order.
pub const AUTHORITY_KEYS: [&str; 14] = [
    "owner",
    "scope",
    "active_scope_pin",
    "file_scope_pin",
    "project_id",
    "project_root_pin",
    "authority_epoch",
    "authority_revision",
    "source",
    "delegation",
    "lock",
    "acceptance",
    "requirements",
    "evidence_manifest",
];

/// An override's reason, in bytes.
pub const OVERRIDE_REASON_BYTES_MAX: usize = 1024;
/// Superseded tasks whose obligations one `done` may carry.
pub const SUPERSEDED_PER_TASK_MAX: usize = 64;
/// A cancellation's reason, in bytes.
pub const REASON_BYTES_MAX: usize = 1024;
/// Open items one cancellation resolves (more stay open until they lapse).
pub const CANCEL_ITEMS_MAX: usize = 1024;
/// Obligations one superseded task hands to its successor's `done`.
const CARRIED_ITEMS_MAX: usize = 256;

/// What `task_amend` replaces: each given list replaces the task's, an absent one stays.
#[derive(Debug, Clone, Default)]
pub struct AmendArgs {
    pub task: String,
    pub requirements: Option<Vec<String>>,
    pub accept: Option<Vec<Value>>,
}

fn none() -> String {
    "none".into()
}

impl Engine {
    /// The task's authority keys as they stand now, with `ancestors` its checked lineage and
    /// `lease_gen` the lease it holds (or is about to take).
    pub(crate) fn authority_pin(
        &self,
        t: &TaskRow,
        ancestors: &[TaskRow],
        lease_gen: Option<u64>,
    ) -> Outcome<BTreeMap<String, String>> {
        let room = self
            .control()
            .room(&t.room)
            .map_err(store_err)?
            .ok_or_else(|| Refusal::new(Code::RoomNotFound, format!("no room {}", t.room)))?;
        let project = match &t.project_id {
            Some(pid) => Some(self.revalidate_project(pid)?),
            None => None,
        };
        let source = self.source_key(t)?;
        let files: Vec<&String> = t.scopes.iter().filter(|s| s.starts_with("file:")).collect();
        let origins: Vec<Value> = t
            .acceptance
            .iter()
            .filter_map(|c| match c {
                Check::EvidenceOrigins { req, min } => Some(json!([req, min])),
                _ => None,
            })
            .collect();
        let lineage: Vec<Value> = ancestors
            .iter()
            .map(|a| json!([a.id, a.owner, a.project_id, a.revision]))
            .collect();
        let values = [
            t.owner.clone(),
            digest_of(&json!(t.scopes)),
            format!(
                "{}:{}",
                room.graph_id,
                room.project_id.as_deref().unwrap_or("coordination")
            ),
            digest_of(
                &json!({"root": project.as_ref().map(|p| &p.canonical_root), "files": files}),
            ),
            t.project_id.clone().unwrap_or_else(none),
            project.as_ref().map_or_else(none, |p| {
                format!("{}:{}:{}:{}", p.dev, p.ino, p.mnt_id, p.canonical_root)
            }),
            room.reset_gen.to_string(),
            t.revision.to_string(),
            source,
            digest_of(&json!(lineage)),
            lease_gen.map_or_else(none, |g| format!("lease:{g}")),
            digest_of(&json!(t.acceptance)),
            digest_of(&json!(t.requirements)),
            digest_of(&json!({"origins": origins,
                "owner_min": self.policy().evidence_origins_min})),
        ];
        Ok(AUTHORITY_KEYS
            .iter()
            .zip(values)
            .map(|(k, v)| ((*k).to_string(), v))
            .collect())
    }

    /// The `source` authority key: the governed task's source as it stands now. A document
    /// that changes under its worker moves it (the reading must cover the new text), and so do
    /// a source replaced or cleared by the owner.
    pub(crate) fn source_key(&self, t: &TaskRow) -> Outcome<String> {
        Ok(match (&t.project_id, t.governed) {
            (Some(pid), true) => self
                .source_view(pid)?
                .map_or_else(|| "missing".to_string(), |(_, view)| view),
            _ => none(),
        })
    }

    /// `done`'s second step: every authority key the claim pinned must stand unchanged.
    pub(crate) fn require_pinned_authority(
        &self,
        t: &TaskRow,
        ancestors: &[TaskRow],
    ) -> Outcome<()> {
        if crate::planted::bug("04-C11") {
            return Ok(());
        }
        let hint = "claim the task again to take its current terms and authority, check the work, then done";
        let Some(pinned) = &t.claim_pin else {
            return Err(Refusal::new(
                Code::TaskAuthorityChanged,
                format!(
                    "the claim of task {} pinned no authority (it was journaled before claims did)",
                    t.id
                ),
            )
            .detail(json!({"task": t.id, "changed": ["claim_pin"]}))
            .hint(hint));
        };
        let now = self.authority_pin(t, ancestors, t.lease_gen.filter(|_| t.lease_held))?;
        let changed: Vec<&str> = AUTHORITY_KEYS
            .iter()
            .copied()
            .filter(|k| pinned.get(*k) != now.get(*k))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        let terms = changed
            .iter()
            .any(|k| matches!(*k, "acceptance" | "requirements" | "evidence_manifest"));
        let (code, what) = if terms {
            (
                Code::TaskAcceptanceChangedBeforeCompletion,
                "its acceptance terms changed",
            )
        } else {
            (Code::TaskAuthorityChanged, "its authority changed")
        };
        Err(Refusal::new(
            code,
            format!(
                "task {}: {what} since it was claimed ({})",
                t.id,
                changed.join(", ")
            ),
        )
        .detail(json!({"task": t.id, "changed": changed,
            "revision_at_claim": pinned.get("authority_revision"), "revision": t.revision}))
        .hint(hint))
    }

    /// Whether a claimed task's authority moved since its claim pinned it (or it pinned none).
    pub(crate) fn claim_moved(&self, t: &TaskRow) -> Outcome<bool> {
        let Some(pinned) = &t.claim_pin else {
            return Ok(true);
        };
        let ancestors = match self.valid_ancestry(&t.id, t.parent.as_deref()) {
            Ok(a) => a,
            // the claim itself will refuse with the reason
            Err(_) => return Ok(true),
        };
        let now = self.authority_pin(t, &ancestors, t.lease_gen.filter(|_| t.lease_held))?;
        Ok(&now != pinned)
    }

    /// `task_amend`: the owner replaces a live task's requirements and checks. The task's
    /// revision moves, so a claim taken before it cannot close the task (`done` refuses with
    /// `task_acceptance_changed_before_completion` until its worker claims again).
    pub fn task_amend(&self, caller: &AgentCaller, a: AmendArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::TaskAmend)?;
        if a.requirements.is_none() && a.accept.is_none() {
            return Err(Refusal::invalid(
                "requirements",
                "give requirements, accept or both: the lists that replace the task's",
            ));
        }
        if let Some(r) = &a.requirements {
            room_core::acceptance::check_requirements(r)?;
        }
        let checks = match &a.accept {
            Some(list) => Some(room_core::acceptance::parse_list(list)?),
            None => None,
        };
        let t = self.task_row(&a.task)?;
        let (handle, binding) = self.member_handle(&p, &t.room)?;
        owned_by(&t, &p.name, "amend")?;
        if let Some(c) = &checks {
            self.admit_checks(c, binding.project().is_some(), &t.scopes)?;
        }
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let t = self.task_row(&a.task)?;
        live(&t, "amended")?;
        let terms = TaskTerms {
            revision: t.revision + 1,
            requirements: a.requirements.unwrap_or_else(|| t.requirements.clone()),
            acceptance: checks.unwrap_or_else(|| t.acceptance.clone()),
        };
        if terms.requirements == t.requirements && terms.acceptance == t.acceptance {
            return Err(Refusal::invalid(
                "accept",
                "the new terms equal the task's: nothing to amend",
            ));
        }
        let bytes = serde_json::to_string(&terms).map_or(0, |s| s.len() as u64);
        let now = self.now_ms();
        h.check_bytes(&p.name, bytes, self.policy().quotas.bytes_per_minute, now)?;
        let te = TaskEvent {
            actor: p.name.clone(),
            action: "amended".into(),
            task: t.id.clone(),
            terms: Some(terms),
            ..TaskEvent::default()
        };
        let rec = h.commit(self, vec![EventBody::Task(Box::new(te))], None)?;
        h.record_bytes(&p.name, bytes, now);
        drop(h);
        let t = self.task_row(&a.task)?;
        Ok(
            json!({"task": crate::verbs::task_view(&t), "revision": t.revision,
            "event": rec[0].id}),
        )
    }

    /// An operator's acceptance override (the owner console): a task that states requirements
    /// and declares no checks may then close, on this recorded reason.
    pub fn task_override(&self, _owner: &crate::Owner, task: &str, reason: &str) -> Outcome<Value> {
        if reason.trim().is_empty()
            || reason.len() > OVERRIDE_REASON_BYTES_MAX
            || reason.chars().any(|c| c.is_control() && c != '\n')
        {
            return Err(Refusal::invalid(
                "reason",
                format!("must be 1..={OVERRIDE_REASON_BYTES_MAX} bytes without control characters"),
            ));
        }
        let handle = self.room_handle(&self.task_row(task)?.room)?;
        let mut h = lock_room(&handle);
        h.writable()?;
        let t = self.task_row(task)?;
        live(&t, "overridden")?;
        if !t.acceptance.is_empty() {
            return Err(Refusal::invalid(
                "task",
                format!(
                    "task {task} declares acceptance checks: done measures them, and an override stands in only for an empty list"
                ),
            ));
        }
        if t.requirements.is_empty() {
            return Err(Refusal::invalid(
                "task",
                format!("task {task} states no requirements: it needs no override to close"),
            ));
        }
        let te = TaskEvent {
            actor: "owner".into(),
            action: "acceptance_override".into(),
            task: t.id.clone(),
            reason: Some(reason.into()),
            ..TaskEvent::default()
        };
        let rec = h.commit(self, vec![EventBody::Task(Box::new(te))], None)?;
        Ok(json!({"task": t.id, "override": {"reason": reason}, "event": rec[0].id}))
    }

    /// `task_supersede`: the owner replaces a live task with a verified successor (same owner,
    /// source, project and requirements, non-empty acceptance, no wider scope). The old task
    /// settles as superseded and releases its lease; its open obligations stay open until the
    /// successor's passing `done` resolves them.
    pub fn task_supersede(
        &self,
        caller: &AgentCaller,
        task: &str,
        successor: &str,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::TaskSupersede)?;
        let old = self.task_row(task)?;
        if !room_core::id::is_task_id(successor) {
            return Err(Refusal::invalid(
                "successor",
                "not a task id (tsk_ and 16 hex)",
            ));
        }
        let (handle, _) = self.member_handle(&p, &old.room)?;
        owned_by(&old, &p.name, "supersede")?;
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let old = self.task_row(task)?;
        let new = self.task_row(successor)?;
        live(&old, "superseded")?;
        let failed = self.successor_failures(&old, &new)?;
        if !failed.is_empty() {
            return Err(Refusal::new(
                Code::TaskSuccessorUnverified,
                format!(
                    "task {successor} is not a verified successor of {task}: {}",
                    failed.join(", ")
                ),
            )
            .detail(json!({"task": task, "successor": successor, "failed": failed}))
            .hint("a successor keeps the owner, project, requirements and source, declares checks and stays inside the old scopes"));
        }
        let te = TaskEvent {
            actor: p.name.clone(),
            action: "superseded".into(),
            task: old.id.clone(),
            transition: Some(TaskTransition {
                task: old.id.clone(),
                from: old.status,
                to: TaskStatus::Superseded,
                recipient: old.recipient.clone(),
            }),
            successor: Some(new.id.clone()),
            ..TaskEvent::default()
        };
        let rec = h.commit(self, vec![EventBody::Task(Box::new(te))], None)?;
        Ok(
            json!({"task": old.id, "status": "superseded", "successor": new.id,
            "event": rec[0].id}),
        )
    }

    /// `task_cancel`: the owner withdraws a live task. It settles as cancelled, its lease is
    /// released and its holder's claim ends, its open mentions and obligations resolve as
    /// cancelled (their queued wakes then fail revalidation and are dead-lettered), and its
    /// subtasks can no longer close (their ancestry is no longer live).
    pub fn task_cancel(
        &self,
        caller: &AgentCaller,
        task: &str,
        reason: Option<&str>,
    ) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::TaskCancel)?;
        if let Some(r) = reason
            && (r.trim().is_empty()
                || r.len() > REASON_BYTES_MAX
                || r.chars().any(char::is_control))
        {
            return Err(Refusal::invalid(
                "reason",
                format!("1..={REASON_BYTES_MAX} bytes without control characters"),
            ));
        }
        let t = self.task_row(task)?;
        let (handle, _) = self.member_handle(&p, &t.room)?;
        owned_by(&t, &p.name, "cancel")?;
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let t = self.task_row(task)?;
        live(&t, "cancelled")?;
        let mut open = h
            .index
            .open_items_of_task(&t.id, CANCEL_ITEMS_MAX)
            .map_err(store_err)?;
        // a successor's cancellation also settles what it carried for the tasks it superseded
        // (their own done can never come: they are settled)
        let (_, carried) = self.carried_items(&h, &t)?;
        for c in carried {
            if open.len() < CANCEL_ITEMS_MAX && !open.iter().any(|o| o.id == c.id) {
                open.push(c);
            }
        }
        let resolves: Vec<Resolution> = open
            .iter()
            .map(|i| Resolution {
                id: i.id.clone(),
                item: i.kind,
                status: "cancelled".into(),
            })
            .collect();
        let te = TaskEvent {
            actor: p.name.clone(),
            action: "cancelled".into(),
            task: t.id.clone(),
            transition: Some(TaskTransition {
                task: t.id.clone(),
                from: t.status,
                to: TaskStatus::Cancelled,
                recipient: t.recipient.clone(),
            }),
            cancel_reason: reason.map(String::from),
            resolves: resolves.clone(),
            ..TaskEvent::default()
        };
        let rec = h.commit(self, vec![EventBody::Task(Box::new(te))], None)?;
        Ok(
            json!({"task": t.id, "status": "cancelled", "from": t.status,
            "resolved": resolves, "lease_released": t.lease_held, "event": rec[0].id}),
        )
    }

    /// Why `new` is not a verified successor of `old` (empty: it is).
    pub(crate) fn successor_failures(&self, old: &TaskRow, new: &TaskRow) -> Outcome<Vec<String>> {
        let mut failed = Vec::new();
        let mut fail = |ok: bool, what: &str| {
            if !ok {
                failed.push(what.to_string());
            }
        };
        fail(new.id != old.id, "itself");
        fail(new.room == old.room, "room");
        fail(new.owner == old.owner, "owner");
        fail(new.project_id == old.project_id, "project");
        fail(new.requirements == old.requirements, "requirements");
        fail(new.governed == old.governed, "source");
        fail(!new.acceptance.is_empty(), "acceptance");
        fail(!new.status.is_settled(), "successor_settled");
        let parse = |list: &[String]| -> Vec<Scope> {
            list.iter()
                .filter_map(|s| Scope::parse("scopes", s).ok())
                .collect()
        };
        let (olds, news) = (parse(&old.scopes), parse(&new.scopes));
        fail(
            news.iter().all(|n| olds.iter().any(|o| o.contains(n))),
            "scope",
        );
        // a successor beneath the task it replaces would lose its own live ancestor
        let mut next = new.parent.clone();
        let mut steps = 0;
        while let Some(id) = next {
            if id == old.id {
                failed.push("ancestry".into());
                break;
            }
            steps += 1;
            if steps > crate::lineage::ANCESTRY_DEPTH_MAX {
                break;
            }
            next = self
                .control()
                .task(&id)
                .map_err(store_err)?
                .and_then(|a| a.parent);
        }
        Ok(failed)
    }

    /// The open items of the tasks `t` verifiably superseded: what its passing `done` resolves
    /// beside its own, with the superseded tasks' ids.
    pub(crate) fn carried_items(
        &self,
        h: &crate::room::RoomHandle,
        t: &TaskRow,
    ) -> Outcome<(Vec<String>, Vec<room_store::index::ItemRow>)> {
        let mut from = Vec::new();
        let mut items = Vec::new();
        let olds = self.control().superseded_by(&t.id).map_err(store_err)?;
        for old in olds.iter().take(SUPERSEDED_PER_TASK_MAX) {
            if !self.successor_failures(old, t)?.is_empty() {
                continue;
            }
            from.push(old.id.clone());
            let open = h
                .index
                .open_items_of_task(&old.id, CARRIED_ITEMS_MAX)
                .map_err(store_err)?;
            items.extend(
                open.into_iter()
                    .filter(|i| i.kind == room_store::index::ItemKind::Obligation),
            );
        }
        Ok((from, items))
    }
}

fn owned_by(t: &TaskRow, me: &str, what: &str) -> Outcome<()> {
    if t.owner == me {
        return Ok(());
    }
    Err(Refusal::new(
        Code::TaskNotHeld,
        format!(
            "task {} is owned by {}; only its owner may {what} it",
            t.id, t.owner
        ),
    ))
}

fn live(t: &TaskRow, then: &str) -> Outcome<()> {
    if !t.status.is_settled() {
        return Ok(());
    }
    Err(Refusal::new(
        Code::TaskStateInvalid,
        format!(
            "task {} is {}; a settled task cannot be {then}",
            t.id, t.status
        ),
    ))
}
