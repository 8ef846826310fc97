//! Applying proposals: the path of a `task_propose` through the daemon. The engine admits it
//! (authority) and, still under the room's lock, runs this module's apply: the outbox takes
//! the intention durably and `room-exec` applies it to the live source; the engine journals
//! the outcome and only then the intention goes. A crash between
//! the intention and the record is resolved at the next start (`recover`), by observing the
//! live row. A proposal that was not applied (the row moved, the source refused) changed
//! nothing and is refused with its code; nothing about it is journaled.

use room_core::event::ProposalRecord;
use room_core::stage::Proposal;
use room_core::{Code, Refusal};
use room_engine::Engine;
use room_engine::principal::AgentCaller;
use room_engine::proposal::Admitted;
use room_exec::proposal::{Observed, Outbox};
use serde_json::Value;
use std::sync::Mutex;

/// One proposal is applied at a time: two proposals for one row must meet its version one
/// after the other, never both read the same version.
static APPLYING: Mutex<()> = Mutex::new(());

fn outbox(engine: &Engine) -> Outbox {
    Outbox::new(engine.proposal_outbox())
}

fn record(a: &Admitted, outcome: &str) -> ProposalRecord {
    ProposalRecord {
        id: a.id.clone(),
        change: a.proposal.clone(),
        outcome: outcome.into(),
        code: None,
        to_version: None,
        before_sha256: None,
        after_sha256: None,
        recovered: false,
        detail: None,
        worker: None,
        conversation_key: None,
    }
}

/// `task_propose`: admit, take the intention, apply, record (the engine holds the room's lock
/// from the admission to the record), then drop the intention.
pub(crate) fn propose(
    engine: &Engine,
    caller: &AgentCaller,
    task: &str,
    proposal: Proposal,
) -> Result<Value, Refusal> {
    let _one = APPLYING.lock().unwrap_or_else(|p| p.into_inner());
    let ob = outbox(engine);
    let (a, out) = engine.proposal_apply(caller, task, proposal, |a| apply(&ob, a))?;
    ob.remove(&a.id).map_err(Refusal::storage)?;
    Ok(out)
}

/// The intention, durable (with the source's digest before, so a recovery names it too); the
/// change; its record, or the refusal of a change not made.
fn apply(ob: &Outbox, a: &Admitted) -> Result<ProposalRecord, Refusal> {
    let root = std::path::Path::new(&a.root);
    let before =
        room_exec::proposal::digest(root, &a.proposal.path).map_err(|e| not_applied(a, e))?;
    let mut doc = serde_json::to_value(a).expect("admitted proposals serialize");
    doc["before_sha256"] = Value::String(before.clone());
    ob.put(&a.id, &doc).map_err(Refusal::storage)?;
    crate::workers::fault("proposal_after_intent");
    let applied = room_exec::proposal::apply_at(root, &a.selection, &a.proposal, &before);
    crate::workers::fault("proposal_after_apply");
    match applied {
        Ok(ap) => {
            let mut rec = record(a, "applied");
            rec.to_version = Some(ap.to_version);
            rec.before_sha256 = Some(ap.before_sha256);
            rec.after_sha256 = Some(ap.after_sha256);
            // a record that fails leaves the intention for the next start to resolve
            Ok(rec)
        }
        Err(e) => {
            ob.remove(&a.id).map_err(Refusal::storage)?;
            Err(not_applied(a, e))
        }
    }
}

/// The refusal of a change that was not made.
fn not_applied(a: &Admitted, e: room_exec::proposal::ProposalError) -> Refusal {
    let code = match e.code {
        "proposal_version_conflict" => Code::ProposalVersionConflict,
        _ => Code::ProposalSourceRefused,
    };
    Refusal::new(code, e.message)
        .detail(serde_json::json!({"path": a.proposal.path, "key": a.proposal.key}))
        .hint("read the row again (a fresh launch stages it again) and propose against its version")
}

/// Resolve what a crash left in the outbox: each intention's live row says whether it was
/// applied, and that is journaled (`recovered: true`) before the intention goes. Returns how
/// many were resolved; one that cannot be recorded stays for the next start.
pub(crate) fn recover(engine: &Engine) -> Result<usize, String> {
    let _one = APPLYING.lock().unwrap_or_else(|p| p.into_inner());
    let ob = outbox(engine);
    let pending = ob
        .pending()
        .map_err(|e| format!("the proposal outbox: {e}"))?;
    let scratch = room_exec::proposal::scratch(ob.dir()).map_err(|e| e.to_string())?;
    let mut n = 0;
    for (id, doc) in pending {
        // recorded with the intention (none in one an earlier version wrote)
        let before = doc
            .get("before_sha256")
            .and_then(Value::as_str)
            .map(String::from);
        let a: Admitted = serde_json::from_value(doc).map_err(|e| format!("proposal {id}: {e}"))?;
        let seen = room_exec::proposal::observe(
            std::path::Path::new(&a.root),
            &a.selection,
            &a.proposal,
            &scratch,
        );
        let mut rec = match seen {
            Observed::Applied { version, sha256 } => {
                let mut r = record(&a, "applied");
                r.to_version = Some(version);
                r.before_sha256 = before;
                r.after_sha256 = Some(sha256);
                r
            }
            Observed::NotApplied { .. } => {
                let mut r = record(&a, "not_applied");
                r.code = Some("interrupted_before_apply".into());
                r
            }
            Observed::InDoubt(why) => {
                let mut r = record(&a, "in_doubt");
                r.detail = Some(why);
                r
            }
        };
        rec.recovered = true;
        let outcome = rec.outcome.clone();
        engine
            .proposal_recovered(&a, rec)
            .map_err(|r| format!("proposal {id}: {r}"))?;
        ob.remove(&id).map_err(|e| format!("proposal {id}: {e}"))?;
        tracing::warn!(proposal = %id, %outcome, "a proposal a crash left unrecorded is resolved");
        n += 1;
    }
    Ok(n)
}
