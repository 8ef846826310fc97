//! Evidence handles: `ev_<32hex>`, each registered in one room with either its first-hand
//! origin (`url:https://…`, `file:docs/spec.md`, `agent:reviewer/run-7`) or the evidence it
//! derives from (its lineage, in the same room). An `evidence_origins` check counts the
//! distinct first-hand origins behind a task requirement's evidence after collapsing lineage:
//! ten summaries of one web page are one origin, not ten. A handle cited in another room is
//! refused (`cross_room_evidence_refused`).

use crate::principal::AgentCaller;
use crate::room::RoomHandle;
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::acceptance::{CheckResult, valid_req};
use room_core::event::{EventBody, EvidenceEvent};
use room_core::scope::Scope;
use room_core::{Code, Refusal, Verb, id};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Evidence a derived item may name directly.
pub const LINEAGE_MAX: usize = 16;
/// Links a collapse walks up, and items it visits, per check.
pub const LINEAGE_DEPTH_MAX: usize = 16;
pub const COLLAPSE_VISITS_MAX: usize = 1_024;
/// Evidence of one requirement an `evidence_origins` check reads.
pub const EVIDENCE_PER_REQ_MAX: usize = 256;
pub const SUMMARY_BYTES_MAX: usize = 1_024;

/// Arguments of `evidence_register`, decoded from the wire.
#[derive(Debug, Clone, Default)]
pub struct EvidenceArgs {
    pub room: String,
    pub task: Option<String>,
    pub req: Option<String>,
    pub origin: Option<String>,
    pub lineage: Vec<String>,
    pub summary: Option<String>,
    /// Members who read it (the registrant always): empty for every reader.
    pub audience: Vec<String>,
}

impl Engine {
    pub fn evidence_register(&self, caller: &AgentCaller, a: EvidenceArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::EvidenceRegister)?;
        match (&a.origin, a.lineage.is_empty()) {
            (Some(o), true) => {
                Scope::parse("origin", o)?;
            }
            (None, false) if a.lineage.len() <= LINEAGE_MAX => {}
            (None, false) => {
                return Err(Refusal::invalid(
                    "lineage",
                    format!("at most {LINEAGE_MAX} handles"),
                ));
            }
            _ => {
                return Err(Refusal::invalid(
                    "origin",
                    "give a first-hand origin (namespace:resource) or a lineage of evidence handles, not both",
                ));
            }
        }
        if let Some(r) = &a.req
            && !valid_req(r)
        {
            return Err(Refusal::invalid("req", "must be 1..=32 of A-Z a-z 0-9 _ -"));
        }
        if a.req.is_some() && a.task.is_none() {
            return Err(Refusal::invalid(
                "task",
                "evidence for a requirement names its task",
            ));
        }
        if let Some(s) = &a.summary
            && (s.len() > SUMMARY_BYTES_MAX || s.chars().any(char::is_control))
        {
            return Err(Refusal::invalid(
                "summary",
                format!("at most {SUMMARY_BYTES_MAX} bytes without control characters"),
            ));
        }
        let mut lineage_events = Vec::with_capacity(a.lineage.len());
        for h in &a.lineage {
            lineage_events.push(self.evidence_here(&a.room, h, "lineage", &p.name)?);
        }
        let (handle, binding) = self.member_handle(&p, &a.room)?;
        let members = self.control().members(&a.room).map_err(store_err)?;
        let asked = crate::visibility::asked(&a.audience, &p.name, &members, &a.room)?;
        // a file of the project is measured now, outside the room lock: the evidence is
        // pinned to that content
        let sha256 = match (
            a.origin.as_deref().and_then(|o| o.strip_prefix("file:")),
            binding.project(),
        ) {
            (Some(rel), Some(pid)) => self.measure_file(pid, rel)?,
            _ => None,
        };
        if let Some(t) = &a.task {
            let row = self.task_row(t)?;
            if row.room != a.room {
                return Err(Refusal::invalid(
                    "task",
                    format!("task {t} belongs to room {}", row.room),
                ));
            }
        }
        let ev = id::evidence_id(self.env.entropy.as_ref());
        let body = EvidenceEvent {
            actor: p.name.clone(),
            evidence: ev.clone(),
            task: a.task.clone(),
            req: a.req.clone(),
            origin: a.origin.clone(),
            lineage: a.lineage.clone(),
            summary: a.summary.clone(),
            sha256: sha256.clone(),
            audience: Vec::new(),
        };
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let mut body = body;
        body.audience = crate::visibility::close_over(&h, &p.name, asked, &lineage_events)?;
        // a task's evidence is part of its acceptance, which every reader of the room sees
        if a.task.is_some() && !body.audience.is_empty() {
            return Err(Refusal::invalid(
                "audience",
                "evidence for a task is read by every reader of its room (its acceptance is); register it without an audience, from evidence without one",
            ));
        }
        let bytes = (a.summary.as_ref().map_or(0, String::len)
            + a.origin.as_ref().map_or(0, String::len)) as u64;
        let now = self.now_ms();
        h.check_bytes(&p.name, bytes, self.policy().quotas.bytes_per_minute, now)?;
        let audience = body.audience.clone();
        let rec = h.commit(self, vec![EventBody::Evidence(Box::new(body))], None)?;
        h.record_bytes(&p.name, bytes, now);
        let origins = collapse(&h, &ev)?;
        Ok(
            json!({"evidence": ev, "event": rec[0].id, "origins": origins, "sha256": sha256,
            "audience": audience}),
        )
    }

    /// The live SHA-256 of a project file, or `None` when it cannot be read as one.
    fn measure_file(&self, project: &str, rel: &str) -> Outcome<Option<String>> {
        let root = self.revalidate_project(project)?.canonical_root;
        Ok(self
            .env
            .fs
            .sha256_beneath(std::path::Path::new(&root), std::path::Path::new(rel))
            .ok()
            .map(|(sha, _)| sha))
    }

    /// The task's evidence in content-mismatch quarantine: pinned to a file whose content is
    /// no longer what was measured at registration (or is unreadable), and not replaced by a
    /// newer registration of the same origin that matches it.
    pub(crate) fn quarantined(&self, h: &RoomHandle, task: &str) -> Outcome<Vec<Value>> {
        let Some(project) = h.binding.project() else {
            return Ok(Vec::new());
        };
        let rows = h
            .index
            .evidence_of_task(task, EVIDENCE_PER_REQ_MAX)
            .map_err(store_err)?;
        let mut live: std::collections::BTreeMap<String, Option<String>> = Default::default();
        let mut out = Vec::new();
        for r in &rows {
            let (Some(pinned), Some(rel)) = (
                &r.sha256,
                r.origin.as_deref().and_then(|o| o.strip_prefix("file:")),
            ) else {
                continue;
            };
            if !live.contains_key(rel) {
                live.insert(rel.to_string(), self.measure_file(project, rel)?);
            }
            let now = &live[rel];
            if now.as_ref() == Some(pinned) {
                continue;
            }
            let replaced = rows.iter().any(|n| {
                n.seq > r.seq && n.origin == r.origin && n.sha256.is_some() && &n.sha256 == now
            });
            if !replaced {
                out.push(
                    json!({"evidence": r.id, "origin": r.origin, "registered_sha256": pinned,
                    "live_sha256": now}),
                );
            }
        }
        Ok(out)
    }

    /// The evidence a wake cites, rechecked for its recipient now (not inherited from the
    /// sender's view at sealing): a handle still registered in the room, whose room is
    /// readable, and whose `file:` origin still has the digest Room measured at registration,
    /// is served with its passage (origin, summary, lineage); any other is withheld with its
    /// reason. Returns (served, withheld).
    pub(crate) fn deliver_evidence(
        &self,
        room: &str,
        refs: &[String],
    ) -> Outcome<(Vec<Value>, Vec<Value>)> {
        let handle = self.room_handle(room)?;
        let (project, found) = {
            let h = lock_room(&handle);
            if let Err(r) = h.readable() {
                let withheld = refs
                    .iter()
                    .map(|ev| json!({"evidence": ev, "reason": r.code.as_str()}))
                    .collect();
                return Ok((Vec::new(), withheld));
            }
            let mut found = Vec::new();
            for ev in refs.iter().take(LINEAGE_MAX) {
                let row = h.index.evidence(ev).map_err(store_err)?;
                let body = match &row {
                    Some(r) => h
                        .index
                        .event_by_id(&r.event)
                        .map_err(store_err)?
                        .map(|e| e.body),
                    None => None,
                };
                found.push((ev.clone(), row, body));
            }
            (h.binding.project().map(String::from), found)
        };
        let (mut served, mut withheld) = (Vec::new(), Vec::new());
        for (ev, row, body) in found {
            let Some(row) = row else {
                withheld.push(json!({"evidence": ev, "reason": "not_evidence_of_this_room"}));
                continue;
            };
            if let (Some(pinned), Some(rel), Some(p)) = (
                &row.sha256,
                row.origin.as_deref().and_then(|o| o.strip_prefix("file:")),
                &project,
            ) {
                // a project that cannot be measured now withholds, never fails the dispatch
                let live = match self.measure_file(p, rel) {
                    Ok(live) => live,
                    Err(r) => {
                        withheld.push(json!({"evidence": ev, "reason": r.code.as_str()}));
                        continue;
                    }
                };
                if live.as_ref() != Some(pinned) {
                    withheld.push(json!({"evidence": ev, "reason": "content_mismatch",
                        "registered_sha256": pinned, "live_sha256": live}));
                    continue;
                }
            }
            let summary = body
                .and_then(|b| serde_json::from_str::<Value>(&b).ok())
                .and_then(|b| b["summary"].as_str().map(String::from));
            served.push(
                json!({"evidence": ev, "origin": row.origin, "lineage": row.lineage,
                "summary": summary}),
            );
        }
        Ok((served, withheld))
    }

    /// The registration event of evidence handle `ev`, which must be of `room`: one of another
    /// room is `cross_room_evidence_refused`, an unknown one names `field`.
    /// The event that registered evidence `ev` in `room`, as `reader` may name it: evidence
    /// withheld from it is refused exactly as evidence that does not exist.
    pub(crate) fn evidence_here(
        &self,
        room: &str,
        ev: &str,
        field: &str,
        reader: &str,
    ) -> Outcome<String> {
        if !id::is_evidence_id(ev) {
            return Err(Refusal::invalid(
                field,
                format!("{ev:?} is not an evidence handle (ev_ and 32 hex)"),
            ));
        }
        let unknown = || Refusal::invalid(field, format!("{ev} is not evidence of room {room}"));
        let here = self.room_handle(room)?;
        {
            let h = lock_room(&here);
            if let Some(row) = h.index.evidence(ev).map_err(store_err)? {
                let e = h.index.event_by_id(&row.event).map_err(store_err)?;
                return match e {
                    Some(e) if crate::visibility::reads(&e, reader)? => Ok(row.event),
                    _ => Err(unknown()),
                };
            }
        }
        for (name, h) in self.rooms.named() {
            if name == room {
                continue;
            }
            // found there only if the reader reads it there: a withheld one does not exist
            let there = {
                let h = lock_room(&h);
                match h.index.evidence(ev).map_err(store_err)? {
                    Some(row) => match h.index.event_by_id(&row.event).map_err(store_err)? {
                        Some(e) => crate::visibility::reads(&e, reader)?,
                        None => false,
                    },
                    None => false,
                }
            };
            if there {
                return Err(Refusal::new(
                    Code::CrossRoomEvidenceRefused,
                    format!(
                        "evidence {ev} belongs to another room; evidence must come from room {room}"
                    ),
                )
                .detail(json!({"evidence": ev, "field": field})));
            }
        }
        Err(unknown())
    }

    /// `evidence_origins`: distinct first-hand origins behind the task's evidence for `req`.
    pub(crate) fn observe_origins(
        &self,
        task: &str,
        req: &str,
        min: u32,
        h: &RoomHandle,
    ) -> Outcome<CheckResult> {
        let owner_min = self.policy().evidence_origins_min;
        let need = min.max(owner_min);
        let rows = h
            .index
            .evidence_for(task, req, EVIDENCE_PER_REQ_MAX)
            .map_err(store_err)?;
        let quarantined: BTreeSet<String> = self
            .quarantined(h, task)?
            .iter()
            .filter_map(|q| q["evidence"].as_str().map(String::from))
            .collect();
        let mut origins = BTreeSet::new();
        for r in rows.iter().filter(|r| !quarantined.contains(&r.id)) {
            origins.extend(collapse(h, &r.id)?);
        }
        let n = origins.len() as u32;
        Ok(CheckResult {
            kind: "evidence_origins".into(),
            pass: n >= need,
            detail: json!({"req": req, "min": need, "distinct_origins": n, "basis": "task_acceptance",
                "evidence": rows.len(), "origins": origins, "quarantined": quarantined}),
        })
    }
}

/// The first-hand origins behind `ev`: its own, or those of its lineage, walked at most
/// `LINEAGE_DEPTH_MAX` links up and `COLLAPSE_VISITS_MAX` items in all.
fn collapse(h: &RoomHandle, ev: &str) -> Outcome<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut frontier = vec![(ev.to_string(), 0usize)];
    while let Some((e, depth)) = frontier.pop() {
        if !seen.insert(e.clone()) || seen.len() > COLLAPSE_VISITS_MAX || depth > LINEAGE_DEPTH_MAX
        {
            continue;
        }
        let Some(row) = h.index.evidence(&e).map_err(store_err)? else {
            continue;
        };
        match row.origin {
            Some(o) => {
                out.insert(o);
            }
            None => frontier.extend(row.lineage.into_iter().map(|l| (l, depth + 1))),
        }
    }
    Ok(out)
}
