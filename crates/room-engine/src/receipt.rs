//! `worker_receipt` acceptance: measured on a task's immutable submissions (the
//! `proposal_*` records the daemon journaled about what it did with each proposal), never on
//! a receipt a worker wrote. Three profiles, as the seed defines them:
//!
//! - **basic**: at least `min` submissions with a terminal outcome (applied or not applied),
//!   none in doubt, none still recording-pending (an intention in the proposal outbox whose
//!   record a crash cut off) and none whose result its worker has not read. Room applies a
//!   proposal inside the call that makes it, so "pending" has no state of its own here.
//! - **strict**: exactly one applied submission of the named worker, row and fields that
//!   moved the row's version by one, whose result the proposing session read and answered
//!   with a Room message citing the record (`original-session-return-verified`).
//! - **successor**: a task that succeeds another acknowledges one historical submission of
//!   it, pinned by eight values; the acknowledgment is fresh (a message of the worker on this
//!   task citing the record) and never stands for the original return
//!   (`satisfies_original_return: false`, `resolves_original_obligation: false`).
//!
//! "Read" is a checkpoint: the worker's checkpoint in the room confirms past the record. A
//! live record is the worker's own act, answered in its call, so the proposing session's next
//! act there folds past it; a recovered record is the daemon's (`proposal::DAEMON_ACTOR`),
//! foreign to the worker, so only reading it confirms past it. A return cites the record's
//! event id, which the worker can only know from its call's answer or from a page it read.

use crate::event::{EventBody, ProposalRecord};
use crate::room::RoomHandle;
use crate::{Engine, Outcome, store_err};
use room_core::Refusal;
use room_core::acceptance::{CheckResult, Receipt, ReceiptProfile, UNCONFIRMED};
use room_store::control::TaskRow;
use serde_json::{Value, json};
use std::path::PathBuf;

/// Records of one task read to find its submissions; a task with more is not measured
/// (unconfirmed), never measured in part.
pub const TASK_RECORDS_SCANNED_MAX: usize = 4096;
const TASK_RECORDS_PAGE: usize = 512;
/// Events citing one record that are read to find a return.
pub const CITATIONS_SCANNED_MAX: usize = 256;
/// A worker's checkpoints (conversations) in one room that are read to decide "read".
pub const CHECKPOINTS_SCANNED_MAX: usize = 64;
/// Intentions in the proposal outbox that are read to find recording-pending ones.
pub const OUTBOX_SCANNED_MAX: usize = 1024;
/// Tasks a successor's chain is walked back through.
pub const PREDECESSORS_MAX: usize = 64;

/// One journaled submission of a task.
#[derive(Debug, Clone)]
pub(crate) struct Submission {
    pub rec: ProposalRecord,
    pub event: String,
    pub seq: u64,
    pub worker: String,
}

/// A message of the worker in the room that cites a submission's record.
struct Return {
    event: String,
    conversation_key: String,
    task: Option<String>,
}

fn unknown(error: String, kind: &str) -> Value {
    json!({"error": error, "error_kind": kind, "observation": UNCONFIRMED})
}

impl Engine {
    /// The proposal outbox: intentions taken before a change is applied and removed once its
    /// record is journaled (`room-exec` writes it; the engine reads what is left in it).
    pub fn proposal_outbox(&self) -> PathBuf {
        self.state.root.join("proposals")
    }

    /// A task's submissions, oldest first, or why they cannot be known.
    pub(crate) fn submissions(
        &self,
        h: &RoomHandle,
        task: &str,
    ) -> Outcome<Result<Vec<Submission>, Value>> {
        let mut out = Vec::new();
        let (mut after, mut scanned) = (0, 0);
        loop {
            let rows = h
                .index
                .task_events(task, after, TASK_RECORDS_PAGE)
                .map_err(store_err)?;
            let full = rows.len() == TASK_RECORDS_PAGE;
            for row in rows {
                scanned += 1;
                if scanned > TASK_RECORDS_SCANNED_MAX {
                    return Ok(Err(unknown(
                        format!(
                            "task {task} has more than {TASK_RECORDS_SCANNED_MAX} records; its submissions are not measured"
                        ),
                        "TooManyRecords",
                    )));
                }
                after = row.seq;
                let body: EventBody = serde_json::from_str(&row.body).map_err(|e| {
                    Refusal::storage(format!("record {} of the index: {e}", row.id))
                })?;
                let EventBody::Task(te) = body else {
                    continue;
                };
                let Some(rec) = te.proposal else {
                    continue;
                };
                let worker = rec.worker.clone().unwrap_or(te.actor);
                out.push(Submission {
                    rec: *rec,
                    event: row.id,
                    seq: row.seq,
                    worker,
                });
            }
            if !full {
                return Ok(Ok(out));
            }
        }
    }

    /// Intentions in the outbox for `task`: their record is not written yet.
    fn recording_pending(&self, task: &str) -> Result<Vec<String>, Value> {
        let dir = self.proposal_outbox();
        let io = |e: &std::io::Error| {
            json!({"error": format!("the proposal outbox: {e}"), "error_kind": format!("{:?}", e.kind()),
                "observation": UNCONFIRMED})
        };
        let names = match self.env.fs.list_dir(&dir, OUTBOX_SCANNED_MAX + 1) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&e)),
        };
        if names.len() > OUTBOX_SCANNED_MAX {
            return Err(unknown(
                format!("more than {OUTBOX_SCANNED_MAX} intentions wait in the proposal outbox"),
                "TooManyIntentions",
            ));
        }
        let mut out = Vec::new();
        for name in names {
            // a hidden name is a write not yet renamed into place: no intention yet (nor is
            // anything else that is not an intention's name)
            let Some(id) = name
                .strip_suffix(".json")
                .filter(|id| room_core::id::is_proposal_id(id))
            else {
                continue;
            };
            let bytes = match self.env.fs.read(&dir.join(&name)) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&e)),
            };
            let doc: Value = serde_json::from_slice(&bytes).map_err(|e| {
                unknown(format!("intention {id} cannot be read: {e}"), "InvalidData")
            })?;
            if doc["task"] == task {
                out.push(id.to_string());
            }
        }
        Ok(out)
    }

    /// Whether the worker read a submission's result (see the module comment).
    fn result_read(&self, h: &RoomHandle, s: &Submission) -> Outcome<bool> {
        let cps = h
            .index
            .checkpoints_of(&s.worker, CHECKPOINTS_SCANNED_MAX)
            .map_err(store_err)?;
        Ok(cps.iter().any(|c| {
            c.confirmed_seq >= s.seq
                && (s.rec.recovered
                    || s.rec
                        .conversation_key
                        .as_ref()
                        .is_none_or(|k| *k == c.conversation_key))
        }))
    }

    /// The worker's messages after a submission that cite its record.
    fn returns(&self, h: &RoomHandle, s: &Submission) -> Outcome<Vec<Return>> {
        let rows = h
            .index
            .citing(&s.event, CITATIONS_SCANNED_MAX)
            .map_err(store_err)?;
        let mut out = Vec::new();
        for row in rows {
            if row.seq <= s.seq || row.actor != s.worker || row.kind != "turn" {
                continue;
            }
            if let Ok(EventBody::Turn(t)) = serde_json::from_str::<EventBody>(&row.body) {
                // acceptance results are every reader's: a return some of them may not read
                // neither counts nor is named
                if !t.audience.is_empty() {
                    continue;
                }
                out.push(Return {
                    event: row.id,
                    conversation_key: t.conversation_key,
                    task: t.task,
                });
            }
        }
        Ok(out)
    }

    /// Evaluate one `worker_receipt` check of `t` (under the room's lock `h`).
    pub(crate) fn observe_receipt(
        &self,
        t: &TaskRow,
        r: &Receipt,
        h: &RoomHandle,
    ) -> Outcome<CheckResult> {
        let detail = match r.profile {
            ReceiptProfile::Basic => self.receipt_basic(t, r, h)?,
            ReceiptProfile::Strict => self.receipt_strict(t, r, h)?,
            ReceiptProfile::Successor => self.receipt_successor(t, r, h)?,
        };
        let pass = detail.get("proof").is_some_and(|p| p.is_string());
        let mut detail = detail;
        detail["profile"] = json!(r.profile.as_str());
        detail["proposals"] = json!(r.proposals);
        if let Some(w) = &r.worker {
            detail["worker"] = json!(w);
        }
        Ok(CheckResult {
            kind: "worker_receipt".into(),
            pass,
            detail,
        })
    }

    fn receipt_basic(&self, t: &TaskRow, r: &Receipt, h: &RoomHandle) -> Outcome<Value> {
        let min = r.min.unwrap_or(1) as usize;
        let subs = match self.submissions(h, &t.id)? {
            Ok(s) => s,
            Err(v) => return Ok(v),
        };
        let pending = match self.recording_pending(&t.id) {
            Ok(p) => p,
            Err(v) => return Ok(v),
        };
        let subs: Vec<&Submission> = subs
            .iter()
            .filter(|s| r.worker.as_ref().is_none_or(|w| *w == s.worker))
            .collect();
        let terminal = subs.iter().filter(|s| s.rec.is_terminal()).count();
        let in_doubt: Vec<&str> = subs
            .iter()
            .filter(|s| !s.rec.is_terminal())
            .map(|s| s.rec.id.as_str())
            .collect();
        let mut unread = Vec::new();
        for s in &subs {
            if !self.result_read(h, s)? {
                unread.push(s.rec.id.as_str());
            }
        }
        let mut d = json!({"min": min, "submissions": subs.len(), "terminal": terminal,
            "in_doubt": in_doubt, "recording_pending": pending, "worker_unread": unread});
        let why = if terminal < min {
            Some(format!("{terminal} terminal submissions, {min} required"))
        } else if !in_doubt.is_empty() {
            Some("a submission is in doubt: reconcile it first".into())
        } else if !pending.is_empty() {
            Some("a submission's record is still pending (the next start records it)".into())
        } else if !unread.is_empty() {
            Some("a worker has not read a submission's result: it syncs the room first".into())
        } else {
            None
        };
        match why {
            Some(w) => d["error"] = json!(w),
            None => d["proof"] = json!("terminal-submissions-read"),
        }
        Ok(d)
    }

    fn receipt_strict(&self, t: &TaskRow, r: &Receipt, h: &RoomHandle) -> Outcome<Value> {
        let subs = match self.submissions(h, &t.id)? {
            Ok(s) => s,
            Err(v) => return Ok(v),
        };
        let target = r
            .target
            .as_ref()
            .expect("a strict receipt has a target (checked at parse)");
        let fits = |s: &&Submission| {
            let mut set: Vec<&String> = s.rec.change.set.keys().collect();
            set.sort();
            s.rec.outcome == "applied"
                && Some(&s.worker) == r.worker.as_ref()
                && s.rec.change.path == target.path
                && s.rec.change.key == target.key
                && set == r.fields.iter().collect::<Vec<_>>()
                && s.rec.to_version == s.rec.change.version.checked_add(1)
                && r.proposal_id.as_ref().is_none_or(|p| *p == s.rec.id)
        };
        let found: Vec<&Submission> = subs.iter().filter(fits).collect();
        let mut d = json!({"target": {"path": target.path, "key": target.key},
            "fields": r.fields, "candidates": found.len()});
        let [s] = found.as_slice() else {
            d["error"] = json!(if found.is_empty() {
                "no applied submission of this worker sets exactly these fields of this row with its version moved by one".to_string()
            } else {
                format!(
                    "{} applied submissions match; pin one with proposal_id",
                    found.len()
                )
            });
            return Ok(d);
        };
        d["proposal"] = json!(s.rec.id);
        d["event"] = json!(s.event);
        d["from_version"] = json!(s.rec.change.version);
        d["to_version"] = json!(s.rec.to_version);
        let read = self.result_read(h, s)?;
        d["result_read"] = json!(read);
        let Some(key) = s.rec.conversation_key.as_ref() else {
            d["error"] = json!(
                "the record names no session (written before sessions were recorded): an original return cannot be proven"
            );
            d["observation"] = json!(UNCONFIRMED);
            return Ok(d);
        };
        let back = self
            .returns(h, s)?
            .into_iter()
            .find(|x| x.conversation_key == *key);
        match (read, back) {
            (true, Some(b)) => {
                d["returned_by"] = json!(b.event);
                d["proof"] = json!("original-session-return-verified");
            }
            (false, _) => d["error"] = json!("the proposing session has not read the result"),
            (true, None) => {
                d["error"] = json!(
                    "the proposing session has not answered the result with a Room message citing its record (parents)"
                )
            }
        }
        Ok(d)
    }

    /// The tasks `t` succeeds, nearest first, within the successor chain's bound.
    fn predecessors(&self, t: &TaskRow) -> Outcome<Vec<TaskRow>> {
        let mut out: Vec<TaskRow> = Vec::new();
        let mut next = vec![t.id.clone()];
        while let Some(id) = next.pop() {
            let olds = self.control().superseded_by(&id).map_err(store_err)?;
            for old in olds {
                if out.len() >= PREDECESSORS_MAX {
                    return Ok(out);
                }
                if old.id != t.id && !out.iter().any(|o| o.id == old.id) {
                    next.push(old.id.clone());
                    out.push(old);
                }
            }
        }
        Ok(out)
    }

    fn receipt_successor(&self, t: &TaskRow, r: &Receipt, h: &RoomHandle) -> Outcome<Value> {
        let id = r
            .proposal_id
            .as_deref()
            .expect("a successor receipt pins its proposal (checked at parse)");
        let mut d = json!({"proposal": id, "satisfies_original_return": false,
            "resolves_original_obligation": false});
        let mut found = None;
        for old in self.predecessors(t)? {
            if old.room != t.room {
                continue;
            }
            match self.submissions(h, &old.id)? {
                Ok(subs) => {
                    if let Some(s) = subs.into_iter().find(|s| s.rec.id == id) {
                        found = Some((old.id, s));
                        break;
                    }
                }
                Err(v) => return Ok(v),
            }
        }
        let Some((old, s)) = found else {
            d["error"] = json!(format!(
                "no task that {} succeeds (in its room) has submission {id}",
                t.id
            ));
            return Ok(d);
        };
        d["predecessor"] = json!(old);
        d["event"] = json!(s.event);
        let (change, record, outcome) = s.rec.digests();
        let mut mismatched = Vec::new();
        for (pin, want, have) in [
            ("worker", r.worker.as_deref(), s.worker.as_str()),
            (
                "proposal_sha256",
                r.proposal_sha256.as_deref(),
                change.as_str(),
            ),
            ("record_sha256", r.record_sha256.as_deref(), record.as_str()),
            (
                "outcome_sha256",
                r.outcome_sha256.as_deref(),
                outcome.as_str(),
            ),
            ("outcome", r.outcome.as_deref(), s.rec.outcome.as_str()),
        ] {
            if want != Some(have) {
                mismatched.push(pin);
            }
        }
        if !mismatched.is_empty() {
            d["pins_mismatched"] = json!(mismatched);
            d["error"] = json!("the submission is not the one pinned");
            return Ok(d);
        }
        let ack = self
            .returns(h, &s)?
            .into_iter()
            .find(|x| x.task.as_deref() == Some(t.id.as_str()));
        match ack {
            Some(a) => {
                d["acknowledged_by"] = json!(a.event);
                d["proof"] = json!("successor-acknowledgment-verified");
            }
            None => {
                d["error"] = json!(format!(
                    "the worker has not acknowledged the result on task {} (a message on it citing the record)",
                    t.id
                ))
            }
        }
        Ok(d)
    }

    /// A task's submissions as `task show` lists them, with the digests a successor receipt
    /// pins.
    pub(crate) fn submissions_view(&self, h: &RoomHandle, task: &str) -> Outcome<Value> {
        let subs = match self.submissions(h, task)? {
            Ok(s) => s,
            Err(v) => return Ok(v),
        };
        let mut out = Vec::with_capacity(subs.len());
        for s in &subs {
            let (change, record, outcome) = s.rec.digests();
            out.push(
                json!({"proposal": s.rec.id, "worker": s.worker, "outcome": s.rec.outcome,
                "path": s.rec.change.path, "key": s.rec.change.key,
                "from_version": s.rec.change.version, "to_version": s.rec.to_version,
                "recovered": s.rec.recovered, "event": s.event, "seq": s.seq,
                "result_read": self.result_read(h, s)?,
                "proposal_sha256": change, "record_sha256": record, "outcome_sha256": outcome}),
            );
        }
        Ok(json!(out))
    }
}
