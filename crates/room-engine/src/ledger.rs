//! The destination ledger: external operations an agent performs for a task it holds, recorded
//! as Begin (the intention, before the effect), Effect (the agent reports it done) and Resolve
//! (its outcome), per (agent, operation) in that order. Every append is checked by the runtime
//! invariants: `exactly_once` (a Begin's idempotency key), `well_formed` (no act outside a claim
//! the agent began, no Effect or Resolve inventing its own Begin, nothing after Resolve),
//! `exclusive` (the destination lies inside the task's leased scopes), `causal` (a Begin whose
//! parent operation is unresolved is flagged beside it) and `resolution` (a Begin unresolved
//! past its TTL is recorded in doubt by the sweep: neither success nor failure).
//!
//! Exactly-once here is exactly-once registration: the ledger cannot make an external effect
//! idempotent. A destination acceptance check reads the folded status and observes the effect
//! afresh with the operation's probe.

use crate::event::{EventBody, Invariant, Severity, Violation};
use crate::principal::AgentCaller;
use crate::room::RoomHandle;
use crate::{Engine, Outcome, invariants, lock_room, store_err};
use room_core::event::{OpEvent, OpPhase, Probe};
use room_core::scope::Scope;
use room_core::{Code, Refusal, TaskStatus, Verb, id};
use room_store::index::OpRow;
use serde_json::{Value, json};

/// An operation's TTL when its Begin names none.
pub const OP_TTL_MS_DEFAULT: u64 = 20 * 60_000;
/// Longest note on a phase.
pub const OP_NOTE_BYTES_MAX: usize = 2_048;
/// Operations one destination check reads per task.
pub const OPS_PER_TASK_MAX: usize = 256;

/// Arguments of `op_begin`, decoded from the wire.
#[derive(Debug, Clone, Default)]
pub struct OpBeginArgs {
    pub room: String,
    pub task: String,
    pub destination: String,
    pub parent: Option<String>,
    pub ttl_ms: Option<u64>,
    pub probe: Option<Value>,
    pub note: Option<String>,
    pub idempotency_key: Option<String>,
}

/// Arguments of `op_effect` and `op_resolve`.
#[derive(Debug, Clone, Default)]
pub struct OpArgs {
    pub room: String,
    pub op: String,
    /// `op_resolve`: `succeeded` or `failed`.
    pub outcome: Option<String>,
    pub note: Option<String>,
}

fn check_note(note: &Option<String>) -> Outcome<()> {
    match note {
        Some(n)
            if n.len() > OP_NOTE_BYTES_MAX || n.chars().any(|c| c.is_control() && c != '\n') =>
        {
            Err(Refusal::invalid(
                "note",
                format!("at most {OP_NOTE_BYTES_MAX} bytes without control characters"),
            ))
        }
        _ => Ok(()),
    }
}

fn ill(actor: &str, act: &str, task: Option<&str>, why: &str, detail: Value) -> Violation {
    let mut d = json!({"why": why});
    if let (Some(m), Some(extra)) = (d.as_object_mut(), detail.as_object()) {
        m.extend(extra.clone());
    }
    Violation {
        actor: actor.into(),
        invariant: Invariant::WellFormed,
        severity: Severity::Reject,
        act: act.into(),
        task: task.map(String::from),
        event: None,
        detail: d,
        audience: Vec::new(),
    }
}

impl Engine {
    pub fn op_begin(&self, caller: &AgentCaller, a: OpBeginArgs) -> Outcome<Value> {
        let p = self.authorize(caller, Verb::OpBegin)?;
        invariants::check_key(a.idempotency_key.as_deref())?;
        invariants::check_ttl(a.ttl_ms)?;
        check_note(&a.note)?;
        let destination = Scope::parse("destination", &a.destination)?;
        let probe = a.probe.as_ref().map(|v| self.parse_probe(v)).transpose()?;
        if let Some(parent) = &a.parent
            && !id::is_op_id(parent)
        {
            return Err(Refusal::invalid(
                "parent",
                "not an operation id (op_ and 16 hex)",
            ));
        }
        let (handle, _) = self.member_handle(&p, &a.room)?;
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let t = self.task_row(&a.task)?;
        if t.room != a.room {
            return Err(Refusal::invalid(
                "task",
                format!("task {} belongs to room {}", t.id, t.room),
            ));
        }
        if let Err(v) = self.check_exactly_once(
            &h,
            &p.name,
            "op_begin",
            a.idempotency_key.as_deref(),
            Some(&t.id),
        ) {
            return Err(self.refuse_check(&mut h, v));
        }
        // claim before act: an operation happens inside a claim its agent began
        // a lapsed claim (its lease released, its scopes perhaps another's) begins nothing
        let begun = t.status == TaskStatus::Claimed
            && t.recipient.as_deref() == Some(p.name.as_str())
            && (t.scopes.is_empty() || t.lease_held)
            && h.index
                .lifecycle(&p.name, &t.id)
                .map_err(store_err)?
                .is_some_and(|l| l.state == "begun" && !l.lapsed);
        if !begun && !self.config.skip_invariants {
            let v = ill(
                &p.name,
                "op_begin",
                Some(&t.id),
                "an operation begins only inside a claim of the task its agent began: claim it first",
                json!({"status": t.status}),
            );
            return Err(self.reject(&mut h, v));
        }
        if !t.scopes.is_empty()
            && !t
                .scopes
                .iter()
                .filter_map(|s| Scope::parse("scopes", s).ok())
                .any(|s| s.contains(&destination))
        {
            return Err(Refusal::new(
                Code::TaskScopeWidened,
                format!(
                    "destination {destination} is outside the scopes task {} leases",
                    t.id
                ),
            )
            .detail(json!({"task": t.id, "scopes": t.scopes, "destination": a.destination}))
            .hint("record operations only on what the task leases"));
        }
        let mut flags = Vec::new();
        if let Some(parent) = &a.parent {
            let row = h.index.op(parent).map_err(store_err)?.ok_or_else(|| {
                Refusal::invalid(
                    "parent",
                    format!("{parent} is not an operation of room {}", a.room),
                )
            })?;
            if row.state != "resolved" {
                flags.push(Violation {
                    actor: p.name.clone(),
                    invariant: Invariant::Causal,
                    severity: Severity::Flag,
                    act: "op_begin".into(),
                    task: Some(t.id.clone()),
                    event: None,
                    detail: json!({"parent": parent, "parent_status": row.status()}),
                    audience: Vec::new(),
                });
            }
        }
        let op = id::op_id(self.env.entropy.as_ref());
        let ev = OpEvent {
            actor: p.name.clone(),
            op: op.clone(),
            phase: OpPhase::Begin,
            task: t.id.clone(),
            destination: Some(destination.to_string()),
            parent: a.parent.clone(),
            ttl_ms: Some(a.ttl_ms.unwrap_or(OP_TTL_MS_DEFAULT)),
            probe,
            outcome: None,
            note: a.note.clone(),
            idempotency_key: a.idempotency_key.clone(),
        };
        let flagged = flags.clone();
        let bytes = a.note.as_ref().map_or(0, |n| n.len() as u64);
        let now = self.now_ms();
        h.check_bytes(&p.name, bytes, self.policy().quotas.bytes_per_minute, now)?;
        let rec = h.commit_flagged(self, vec![EventBody::Op(Box::new(ev))], None, flags)?;
        h.record_bytes(&p.name, bytes, now);
        Ok(json!({"op": op, "status": "begun", "event": rec[0].id,
            "flags": flagged.iter().map(|f| json!({"invariant": f.invariant.as_str(), "detail": f.detail})).collect::<Vec<_>>()}))
    }

    pub fn op_effect(&self, caller: &AgentCaller, a: OpArgs) -> Outcome<Value> {
        self.op_phase(caller, a, OpPhase::Effect)
    }

    pub fn op_resolve(&self, caller: &AgentCaller, a: OpArgs) -> Outcome<Value> {
        self.op_phase(caller, a, OpPhase::Resolve)
    }

    fn op_phase(&self, caller: &AgentCaller, a: OpArgs, phase: OpPhase) -> Outcome<Value> {
        let (verb, act) = match phase {
            OpPhase::Effect => (Verb::OpEffect, "op_effect"),
            _ => (Verb::OpResolve, "op_resolve"),
        };
        let p = self.authorize(caller, verb)?;
        check_note(&a.note)?;
        if !id::is_op_id(&a.op) {
            return Err(Refusal::invalid(
                "op",
                "not an operation id (op_ and 16 hex)",
            ));
        }
        let outcome = match (phase, a.outcome.as_deref()) {
            (OpPhase::Resolve, Some(o @ ("succeeded" | "failed"))) => Some(o.to_string()),
            (OpPhase::Resolve, _) => {
                return Err(Refusal::invalid("outcome", "must be succeeded or failed"));
            }
            (_, None) => None,
            (_, Some(_)) => {
                return Err(Refusal::invalid(
                    "outcome",
                    "only op_resolve takes an outcome",
                ));
            }
        };
        let (handle, _) = self.member_handle(&p, &a.room)?;
        let mut h = lock_room(&handle);
        h.writable()?;
        self.admitted(&h.name)?;
        let row = h.index.op(&a.op).map_err(store_err)?;
        if let Err(v) = self.phase_allowed(&p.name, act, row.as_ref(), phase, &a.op) {
            if self.config.skip_invariants {
                return Err(Refusal::new(Code::InvalidArgument, "not well formed"));
            }
            return Err(self.reject(&mut h, *v));
        }
        let row = row.expect("phase_allowed requires the operation");
        let ev = OpEvent {
            actor: p.name.clone(),
            op: a.op.clone(),
            phase,
            task: row.task.clone(),
            destination: None,
            parent: None,
            ttl_ms: None,
            probe: None,
            outcome: outcome.clone(),
            note: a.note.clone(),
            idempotency_key: None,
        };
        let bytes = a.note.as_ref().map_or(0, |n| n.len() as u64);
        let now = self.now_ms();
        h.check_bytes(&p.name, bytes, self.policy().quotas.bytes_per_minute, now)?;
        let rec = h.commit(self, vec![EventBody::Op(Box::new(ev))], None)?;
        h.record_bytes(&p.name, bytes, now);
        let status = match phase {
            OpPhase::Effect => "effected",
            _ => "resolved",
        };
        Ok(json!({"op": a.op, "status": status, "outcome": outcome, "event": rec[0].id}))
    }

    /// `well_formed` for Effect and Resolve: the operation exists, is the caller's own, and is
    /// not resolved yet.
    fn phase_allowed(
        &self,
        actor: &str,
        act: &str,
        row: Option<&OpRow>,
        phase: OpPhase,
        op: &str,
    ) -> Result<(), Box<Violation>> {
        let Some(row) = row else {
            return Err(Box::new(ill(
                actor,
                act,
                None,
                "an effect or resolution cannot invent its own operation: begin it first (op_begin)",
                json!({"op": op}),
            )));
        };
        if row.agent != actor {
            return Err(Box::new(ill(
                actor,
                act,
                Some(&row.task),
                "only the agent that began an operation records its effect and outcome",
                json!({"op": op, "agent": row.agent}),
            )));
        }
        if row.state == "resolved" {
            let why = match phase {
                OpPhase::Effect => "an effect after the resolution is out of order",
                _ => "the operation is already resolved",
            };
            return Err(Box::new(ill(
                actor,
                act,
                Some(&row.task),
                why,
                json!({"op": op, "outcome": row.outcome}),
            )));
        }
        Ok(())
    }

    /// A probe: a program on the owner's allowlist with a bounded timeout.
    pub(crate) fn parse_probe(&self, v: &Value) -> Outcome<Probe> {
        let mut o = v.clone();
        if let Some(m) = o.as_object_mut() {
            m.insert("kind".into(), json!("command"));
        }
        let check = room_core::acceptance::Check::parse("probe", &o)?;
        let room_core::acceptance::Check::Command {
            program,
            args,
            timeout_ms,
            exit_code,
            project_write,
            network,
        } = check
        else {
            unreachable!("parsed as a command")
        };
        if exit_code != 0 {
            return Err(Refusal::invalid(
                "probe.exit_code",
                "a probe observes presence by exit 0",
            ));
        }
        if !self.policy().acceptance_commands.contains(&program) {
            return Err(Refusal::new(
                Code::AcceptanceCommandNotAllowed,
                format!("probe: {program} is not on the owner's command allowlist"),
            )
            .detail(json!({"field": "probe.program", "program": program}))
            .hint(format!(
                "the owner can allow it in config.toml: [acceptance] commands = [\"{program}\"]"
            )));
        }
        if project_write {
            return Err(Refusal::invalid(
                "probe.project_write",
                "a probe observes; it never writes the project",
            ));
        }
        Ok(Probe {
            program,
            args,
            timeout_ms,
            network,
        })
    }

    /// `resolution` for operations: record each unresolved past its TTL as in doubt (once).
    pub(crate) fn sweep_ops(&self, h: &mut RoomHandle, now: u64, limit: usize) -> Outcome<u64> {
        let lapsed = h.index.lapsed_ops(now, limit).map_err(store_err)?;
        let mut n = 0;
        for o in lapsed {
            let began = h
                .index
                .event_by_seq(o.began_seq)
                .map_err(store_err)?
                .map(|e| e.id);
            let v = Violation {
                actor: o.agent.clone(),
                invariant: Invariant::Resolution,
                severity: Severity::InDoubt,
                act: "op_begin".into(),
                task: Some(o.task.clone()),
                event: began,
                detail: json!({"op": o.id, "destination": o.destination, "state": o.state,
                    "began_ms": o.began_ms, "ttl_ms": o.ttl_ms,
                    "elapsed_ms": now.saturating_sub(o.began_ms), "observation": "unresolved"}),
                audience: Vec::new(),
            };
            h.commit(self, vec![EventBody::InvariantViolation(v)], None)?;
            n += 1;
        }
        Ok(n)
    }
}
