//! `room audit TASK`: one assignment proved from what Room holds, for the owner (issue 45).
//!
//! The report gathers what each of Room's mechanisms recorded about the task and checks it
//! again against today's state: the causal-readiness map (every ancestor of the task's
//! events, who has confirmed reading it), every wake permit sealed for it replayed through
//! dispatch's own revalidation (which would still pass, which would be refused and with which
//! code), every acceptance check measured again on the live artifacts beside the evaluation
//! recorded, the proof ladder each delivery reached, and what a cancel holds. Its verdict says
//! `failed` when a measurement contradicts the acceptance, `unproven` wherever proof is
//! missing, and `proven` only when nothing is.
//!
//! It writes nothing: no journal record, no evaluation kept (`room task check` keeps one; an
//! audit must not replace the very record it compares with). That it ran is logged.

use crate::{Engine, Outcome, lock_room, store_err};
use room_core::acceptance::Evaluation;
use room_core::event::TaskStatus;
use room_core::wake::WakePermit;
use room_store::control::{LaunchRow, TaskRow, WakeRow};
use room_store::index::EventRow;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// A task's events the audit reads, at most.
pub const AUDIT_TASK_EVENTS_MAX: usize = 512;
/// Ancestors of each task event followed, at most (the recursive query's depth).
pub const AUDIT_DEPTH_MAX: u32 = 64;
/// Ancestors listed in the readiness map, at most.
pub const AUDIT_ANCESTORS_MAX: usize = 2_048;
/// Wake permits replayed, at most.
pub const AUDIT_WAKES_MAX: usize = 256;
/// Conversations of one member read for its confirmations, at most.
const AUDIT_CHECKPOINTS_MAX: usize = 64;

/// How far each member has confirmed reading the room: (seq, when its checkpoint last moved).
type Confirmed = BTreeMap<String, (u64, u64)>;

impl Engine {
    /// The audit of one task (see the module comment). Owner only; writes nothing.
    pub fn task_audit(&self, _owner: &crate::Owner, task: &str) -> Outcome<Value> {
        let t = self.task_row(task)?;
        // permits sealed so far go to the queue first, so that the replay finds every one
        self.flush_wakes();
        let members = self.control().members(&t.room).map_err(store_err)?;
        let handle = self.room_handle(&t.room)?;
        let (events, readiness) = {
            let h = lock_room(&handle);
            h.readable()?;
            let events = h
                .index
                .task_records(&t.id, 0, AUDIT_TASK_EVENTS_MAX)
                .map_err(store_err)?;
            let confirmed = confirmed_by_member(&h, &members)?;
            (events.clone(), readiness(&h, &events, &confirmed)?)
        };
        let wakes = self.audit_wakes(&t, &events, &members)?;
        let acceptance = self.audit_acceptance(&t)?;
        let holds: Vec<Value> = self
            .control()
            .holds(&t.room, room_store::control::HOLDS_PAGE_MAX)
            .map_err(store_err)?
            .into_iter()
            .filter(|h| h.task.as_deref() == Some(t.id.as_str()))
            .map(|h| {
                json!({"id": h.id, "kind": h.kind, "item": h.item, "agent": h.agent,
                    "state": if h.resolved_ms.is_some() { "resolved" } else { "held" },
                    "outcome": h.outcome})
            })
            .collect();
        // the recipient's newest record of the task closed it, when it is done
        let done_seq = events
            .iter()
            .filter(|e| t.recipient.as_deref() == Some(e.actor.as_str()))
            .map(|e| e.seq)
            .max();
        let (verdict, reasons) = verdict(&t, &acceptance, &wakes, &holds, &readiness, done_seq);
        tracing::info!(task = %t.id, verdict, "task audited");
        let mut report = json!({
            "task": crate::verbs::task_view(&t),
            "audited_ms": self.now_ms(),
            "verdict": verdict,
            "reasons": reasons,
            "events": events.iter().map(event_view).collect::<Vec<_>>(),
            "readiness": readiness,
            "wakes": wakes,
            "acceptance": acceptance,
            "holds": holds,
        });
        self.policy().redactor()?.redact_in_place(&mut report);
        Ok(report)
    }

    /// Every permit sealed for the task (one per recipient of each of its events), replayed
    /// through dispatch's revalidation now, with the launches it had.
    fn audit_wakes(
        &self,
        t: &TaskRow,
        events: &[EventRow],
        members: &[String],
    ) -> Outcome<Vec<Value>> {
        let now = self.now_ms();
        let mut out = Vec::new();
        'events: for e in events {
            for m in members {
                if out.len() >= AUDIT_WAKES_MAX {
                    break 'events;
                }
                let Some(w) = self.control().wake(&t.room, m, &e.id).map_err(store_err)? else {
                    continue;
                };
                if !sealed_for(&w, &t.id) {
                    continue;
                }
                let replay = match self.revalidate(&w, now) {
                    Ok(_) => json!({"passes": true}),
                    Err(r) => {
                        json!({"passes": false, "code": r.code.as_str(), "message": r.message})
                    }
                };
                let launches: Vec<Value> = self
                    .control()
                    .launches_of_wake(&w.room, &w.agent, &w.source_event)
                    .map_err(store_err)?
                    .iter()
                    .map(launch_view)
                    .collect();
                out.push(json!({"agent": w.agent, "source_event": w.source_event,
                    "state": w.state, "reason": w.reason, "created_ms": w.created_ms,
                    "replay": replay, "launches": launches}));
            }
        }
        Ok(out)
    }

    /// The evaluation recorded for the task beside one measured now (not kept), and which
    /// checks differ between them.
    fn audit_acceptance(&self, t: &TaskRow) -> Outcome<Value> {
        let mut recorded = self.last_evaluation(&t.id)?;
        if recorded.is_object() {
            recorded["source"] =
                json!("the task's newest kept evaluation (its done, or room task check)");
        }
        if t.acceptance.is_empty() {
            return Ok(json!({"declared": 0, "recorded": recorded, "now": null, "changed": []}));
        }
        let pre = self.pre_run_task(t)?;
        let handle = self.room_handle(&t.room)?;
        let now: Evaluation = {
            let h = lock_room(&handle);
            h.readable()?;
            self.evaluate(t, Some(&pre), &h)?
        };
        let now = now.to_value();
        let changed = changed_checks(&recorded, &now);
        Ok(
            json!({"declared": t.acceptance.len(), "recorded": recorded, "now": now,
            "changed": changed}),
        )
    }
}

/// Whether a permit was sealed for `task` (a permit that does not parse is shown as the
/// revalidation judges it, so it is kept).
fn sealed_for(w: &WakeRow, task: &str) -> bool {
    serde_json::from_str::<WakePermit>(&w.permit)
        .map(|p| p.binding.task.as_deref() == Some(task))
        .unwrap_or(true)
}

fn event_view(e: &EventRow) -> Value {
    let body: Value = serde_json::from_str(&e.body).unwrap_or(Value::Null);
    json!({"seq": e.seq, "id": e.id, "kind": e.kind, "actor": e.actor, "hlc_ms": e.hlc_ms,
        "what": body.get("action").or_else(|| body.get("verb")).cloned()})
}

fn launch_view(l: &LaunchRow) -> Value {
    json!({"id": l.id, "state": l.state, "outcome": l.outcome, "proof": l.proof,
        "started_ms": l.started_ms, "ended_ms": l.ended_ms})
}

/// Each member's furthest confirmed seq in the room, over its conversations.
fn confirmed_by_member(h: &crate::room::RoomHandle, members: &[String]) -> Outcome<Confirmed> {
    let mut out = Confirmed::new();
    for m in members {
        let cps = h
            .index
            .checkpoints_of(m, AUDIT_CHECKPOINTS_MAX)
            .map_err(store_err)?;
        if let Some(c) = cps.iter().max_by_key(|c| (c.confirmed_seq, c.updated_ms)) {
            out.insert(m.clone(), (c.confirmed_seq, c.updated_ms));
        }
    }
    Ok(out)
}

/// The task's events and every ancestor they cite, oldest first, with who has confirmed
/// reading each.
fn readiness(
    h: &crate::room::RoomHandle,
    events: &[EventRow],
    confirmed: &Confirmed,
) -> Outcome<Vec<Value>> {
    // the task's own records are what its next actor had to read first, beside what they cite
    let mut ids: BTreeSet<String> = events.iter().map(|e| e.id.clone()).collect();
    for e in events {
        for a in h
            .index
            .ancestors(&e.id, AUDIT_DEPTH_MAX)
            .map_err(store_err)?
        {
            if ids.len() >= AUDIT_ANCESTORS_MAX {
                break;
            }
            ids.insert(a);
        }
    }
    let mut rows = Vec::new();
    for id in &ids {
        let Some(r) = h.index.event_by_id(id).map_err(store_err)? else {
            continue;
        };
        // a member need not read what it wrote itself
        let (by, not_by): (Vec<_>, Vec<_>) = confirmed
            .iter()
            .partition(|(a, (seq, _))| *seq >= r.seq || **a == r.actor);
        rows.push(
            json!({"seq": r.seq, "id": r.id, "kind": r.kind, "actor": r.actor,
            "confirmed_by": by.iter().map(|(a, (seq, at))| json!({"agent": a, "through_seq": seq,
                "at_ms": at})).collect::<Vec<_>>(),
            "unconfirmed_by": not_by.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>()}),
        );
    }
    rows.sort_by_key(|r| r["seq"].as_u64());
    Ok(rows)
}

/// The checks whose outcome differs between the recorded evaluation and the one made now:
/// a pass that became a failure (or the reverse), or a measured value (`actual`) that moved.
fn changed_checks(recorded: &Value, now: &Value) -> Vec<usize> {
    let (Some(then), Some(now)) = (
        recorded["acceptance_results"].as_array(),
        now["acceptance_results"].as_array(),
    ) else {
        return Vec::new();
    };
    then.iter()
        .zip(now)
        .enumerate()
        .filter(|(_, (a, b))| {
            a["pass"] != b["pass"]
                || (a["detail"].get("actual").is_some()
                    && a["detail"]["actual"] != b["detail"]["actual"])
        })
        .map(|(i, _)| i)
        .collect()
}

/// `failed` when a measurement contradicts the acceptance; `unproven` with each missing
/// proof named; `proven` only when none is missing.
fn verdict(
    t: &TaskRow,
    acceptance: &Value,
    wakes: &[Value],
    holds: &[Value],
    readiness: &[Value],
    done_seq: Option<u64>,
) -> (&'static str, Vec<String>) {
    let mut failed = Vec::new();
    let mut missing = Vec::new();
    if t.status != TaskStatus::Done {
        missing.push(format!("the task is {}, not done", status_name(t.status)));
    }
    if let Some(why) = &t.override_reason {
        missing.push(format!(
            "it closed on the owner's override ({why}), not on measured checks"
        ));
    }
    if t.acceptance.is_empty() {
        missing.push("it declares no acceptance check: nothing measures its completion".into());
    } else {
        audit_measurements(acceptance, &mut failed, &mut missing);
    }
    for w in wakes {
        let agent = w["agent"].as_str().unwrap_or("?");
        let proofs: Vec<&str> = w["launches"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["proof"].as_str())
            .collect();
        if !w["launches"].as_array().is_some_and(|l| l.is_empty()) && !proofs.contains(&"replied") {
            missing.push(format!(
                "the delivery to {agent} reached {} on the proof ladder, not replied",
                proofs.last().copied().unwrap_or("no rung")
            ));
        }
    }
    for h in holds.iter().filter(|h| h["state"] == "held") {
        missing.push(format!(
            "{} {} is held until reconciled",
            h["kind"].as_str().unwrap_or("an item"),
            h["item"].as_str().unwrap_or("?")
        ));
    }
    if let (Some(finisher), Some(done_seq)) = (t.recipient.as_deref(), done_seq) {
        // what it acted on: the ancestors before its closing record
        let unread = readiness
            .iter()
            .filter(|r| r["seq"].as_u64().is_some_and(|s| s < done_seq))
            .filter(|r| {
                r["unconfirmed_by"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == finisher))
            })
            .count();
        if unread > 0 && t.status == TaskStatus::Done {
            missing.push(format!(
                "{finisher} has not confirmed reading {unread} of the task's causal ancestors"
            ));
        }
    }
    let verdict = if !failed.is_empty() {
        "failed"
    } else if !missing.is_empty() {
        "unproven"
    } else {
        "proven"
    };
    failed.extend(missing);
    (verdict, failed)
}

/// What the recorded and the new measurement say, into `failed` and `missing`.
fn audit_measurements(acceptance: &Value, failed: &mut Vec<String>, missing: &mut Vec<String>) {
    let recorded = &acceptance["recorded"];
    let now = &acceptance["now"];
    if recorded.is_null() {
        missing.push("no evaluation of its checks was recorded".into());
    } else if recorded["acceptance_pass"] != true {
        missing.push("its newest recorded evaluation did not pass".into());
    }
    if now["acceptance_pass"] != true {
        let failing: Vec<String> = now["acceptance_results"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .filter(|(_, r)| r["pass"] != true)
            .map(|(i, r)| format!("{} (accept[{i}])", r["kind"].as_str().unwrap_or("?")))
            .collect();
        failed.push(format!(
            "measured now, its checks fail on the live artifacts: {}",
            failing.join(", ")
        ));
    }
    if let Some(changed) = acceptance["changed"].as_array().filter(|c| !c.is_empty()) {
        let list: Vec<String> = changed.iter().map(|i| format!("accept[{i}]")).collect();
        failed.push(format!(
            "what its checks measure changed since the recorded evaluation: {}",
            list.join(", ")
        ));
    }
}

fn status_name(s: TaskStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{s:?}"))
}

#[cfg(test)]
mod tests {
    use super::changed_checks;
    use serde_json::json;

    #[test]
    fn a_moved_measurement_is_a_change_and_a_steady_one_is_not() {
        let then = json!({"acceptance_results": [
            {"kind": "sha256", "pass": true, "detail": {"actual": "aa"}},
            {"kind": "file_exists", "pass": true, "detail": {"path": "x"}},
            {"kind": "command", "pass": true, "detail": {"elapsed_ms": 4}}]});
        let now = json!({"acceptance_results": [
            {"kind": "sha256", "pass": true, "detail": {"actual": "bb"}},
            {"kind": "file_exists", "pass": false, "detail": {"path": "x"}},
            {"kind": "command", "pass": true, "detail": {"elapsed_ms": 9}}]});
        assert_eq!(changed_checks(&then, &now), vec![0, 1]);
        assert_eq!(changed_checks(&then, &then), Vec::<usize>::new());
        assert_eq!(changed_checks(&json!(null), &now), Vec::<usize>::new());
    }
}
