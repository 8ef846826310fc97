//! Lifecycle control and active cancellation: who may cancel, resume, reset, open or close
//! admission and break the glass (control standing), what a cancel does to a room's permits,
//! running workers and unresolved effects, and the records of the two-phase stop outbox.
//!
//! Control standing is decided here, from what the transport proved: the owner console, or
//! an authenticated agent whose effective tier is `operator` (and, for a room, a member of
//! it). Nothing a caller writes into its arguments (`by: "operator"`) confers any.
//!
//! A cancel is a journal record; control.db follows from it (at commit and at catch-up): the
//! room stops dispatching, its queued permits are dead-lettered, and the unresolved items a
//! destination may already have accepted are held until an operator reconciles them. Running
//! workers are the observer's (`launch_trips`): the cancel moves the room's cancel
//! generation, so every launch started under the old one no longer has its room's authority.
//! The stop itself (killing the job, observing zero processes) is the daemon's; the records
//! that prove it in order are built and committed here.

use crate::{Caller, Engine, Outcome, Owner, lock_room, store_err};
use room_core::event::{EventBody, Held, StopPredecessor, WorkerStop};
use room_core::{Code, Refusal, Tier, canon, id, name};
use serde_json::{Value, json};

/// Items one cancel holds at most, of each kind.
pub const HOLDS_PER_CANCEL_MAX: usize = 256;
/// Longest evidence text of a reconciliation.
pub const RECONCILE_EVIDENCE_BYTES_MAX: usize = 4_096;
/// Longest `by` a cancel records.
pub const BY_BYTES_MAX: usize = 128;
/// Longest pending reason a stop's phase 1 carries.
pub const STOP_PENDING_BYTES_MAX: usize = 256;
/// What an operator may say a held item came to.
pub const RECONCILE_OUTCOMES: [&str; 3] = ["accepted", "not_accepted", "compensated"];

/// Proof that a caller has control standing. Only `Engine::control_actor` and
/// `Owner::control` make one.
#[derive(Debug, Clone)]
pub struct Control {
    actor: String,
}

impl Control {
    /// Who acts: `owner`, or the operator agent's name.
    pub fn actor(&self) -> &str {
        &self.actor
    }
}

impl Owner {
    /// The owner console has control standing everywhere.
    pub fn control(&self) -> Control {
        Control {
            actor: "owner".into(),
        }
    }
}

/// Why a running launch no longer has its authority (the observer stops it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trip {
    pub launch: String,
    pub room: String,
    pub agent: String,
    /// `break_glass`, `control_epoch_changed`, `room_gone`, `room_cancelled`,
    /// `admission_closed` or `worker_authority_changed`.
    pub reason: &'static str,
    pub detail: String,
}

/// One record of the stop outbox, as its phase file keeps it: the event id drawn for it, its
/// body, and the SHA-256 of that body's canonical JSON (its envelope).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StopEnvelope {
    pub stop: String,
    pub room: String,
    pub event_id: String,
    pub body: Value,
    pub envelope_sha256: String,
}

impl StopEnvelope {
    fn of(room: &str, event_id: String, s: WorkerStop) -> StopEnvelope {
        let stop = s.stop.clone();
        let body = serde_json::to_value(EventBody::WorkerStop(Box::new(s)))
            .expect("event bodies serialize");
        StopEnvelope {
            stop,
            room: room.into(),
            event_id,
            envelope_sha256: canon::digest_of(&body),
            body,
        }
    }

    /// The stop record this envelope carries, checked against its digest.
    pub fn record(&self) -> Result<WorkerStop, Refusal> {
        if canon::digest_of(&self.body) != self.envelope_sha256 || !id::is_event_id(&self.event_id)
        {
            return Err(Refusal::storage(format!(
                "stop {}: its envelope does not match its digest",
                self.stop
            )));
        }
        match serde_json::from_value::<EventBody>(self.body.clone()) {
            Ok(EventBody::WorkerStop(s)) if s.stop == self.stop => Ok(*s),
            _ => Err(Refusal::storage(format!(
                "stop {}: its envelope is not a worker_stop record",
                self.stop
            ))),
        }
    }
}

fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn refused() -> Refusal {
    Refusal::new(
        Code::ControlStandingRequired,
        "lifecycle control needs the owner console or an agent at operator tier",
    )
    .hint("ask the owner, or have the owner raise the agent's max tier to operator")
}

impl Engine {
    /// Control standing for `caller` over `room` (or the whole daemon, for break-glass):
    /// the owner console, or an authenticated operator-tier agent that is a member of the room.
    pub fn control_actor(&self, caller: &Caller, room: Option<&str>) -> Outcome<Control> {
        let a = match caller {
            Caller::Local(_) => {
                return self.owner(caller).map(|o| o.control()).map_err(|r| {
                    if r.code == Code::OwnerRequired {
                        refused()
                    } else {
                        r
                    }
                });
            }
            Caller::Agent(a) => a,
        };
        crate::principal::validate_conversation(&a.conversation)?;
        let row = self.authenticate(&a.token)?;
        let owner_max = Tier::parse(&row.max_tier).unwrap_or(Tier::Observer);
        let declared = a.declared_tier.unwrap_or(Tier::Operator);
        let tier = declared.min(owner_max).min(self.policy().ceiling);
        if tier < Tier::Operator {
            return Err(refused().detail(json!({"agent": row.name, "effective": tier})));
        }
        if let Some(room) = room {
            name::validate("room", room)?;
            self.room_handle(room)?;
            if !self
                .control()
                .is_member(room, &row.name)
                .map_err(store_err)?
            {
                return Err(Refusal::new(
                    Code::RoomNotMember,
                    format!("{} is not a member of room {room}", row.name),
                ));
            }
        }
        Ok(Control { actor: row.name })
    }

    /// Cancel a room: it stops dispatching, its queued and deferred permits are dead-lettered
    /// (never retried), addressed obligations stay unresolved, its cancel generation moves (so
    /// the observer stops every worker started before), and what a destination may already
    /// have accepted is held until reconciled. `by` is recorded and confers nothing.
    pub fn room_cancel(&self, c: &Control, room: &str, by: Option<&str>) -> Outcome<Value> {
        if let Some(b) = by
            && (b.is_empty() || b.len() > BY_BYTES_MAX)
        {
            return Err(Refusal::invalid(
                "by",
                format!("must be 1 to {BY_BYTES_MAX} bytes"),
            ));
        }
        let handle = self.room_handle(room)?;
        // permits sealed so far go to the queue first, so that the cancel finds them there;
        // one sealed after this dies at dispatch (the room is cancelled by then)
        self.flush_wakes();
        let mut h = lock_room(&handle);
        h.writable()?;
        let row = self
            .control()
            .room(room)
            .map_err(store_err)?
            .ok_or_else(|| crate::rooms::Rooms::not_found(room))?;
        if row.cancelled {
            return Err(
                Refusal::invalid("room", format!("room {room} is already cancelled"))
                    .hint(format!("resume it with room resume {room}")),
            );
        }
        let held = if crate::planted::bug("04-C10") {
            Default::default()
        } else {
            self.inventory(&h, room)?
        };
        let dead_before = self.cancelled_permits(room)?;
        let rec = h.commit(
            self,
            vec![EventBody::RoomCancelled {
                actor: c.actor.clone(),
                by: by.map(String::from),
                held: held.clone(),
            }],
            None,
        )?;
        let dead = self.cancelled_permits(room)? - dead_before;
        Ok(json!({"room": room, "cancelled": true, "event": rec[0].id,
            "cancel_gen": rec[0].seq, "actor": c.actor, "by": by,
            "dead_lettered": dead, "held": held_view(&held),
            "obligations": "left unresolved"}))
    }

    /// How many of the room's permits cancels dead-lettered.
    fn cancelled_permits(&self, room: &str) -> Outcome<u64> {
        self.control()
            .wakes_dead_count(room, "room_cancelled")
            .map_err(store_err)
    }

    /// What a cancel holds: the room's unresolved destination operations, and the model
    /// requests of its API workers now in flight (a provider may already have taken them).
    fn inventory(&self, h: &crate::room::RoomHandle, room: &str) -> Outcome<Vec<Held>> {
        let mut held = Vec::new();
        let hold_id = || format!("hld_{}", self.env.entropy.hex(8));
        for op in h
            .index
            .ops_unresolved(HOLDS_PER_CANCEL_MAX)
            .map_err(store_err)?
        {
            held.push(Held {
                hold: hold_id(),
                kind: "destination_operation".into(),
                item: op.id,
                agent: Some(op.agent),
                task: Some(op.task),
            });
        }
        let routes = self.policy().routes.clone();
        let live = self.control().launches_live().map_err(store_err)?;
        for l in live
            .into_iter()
            .filter(|l| l.room == room)
            .take(HOLDS_PER_CANCEL_MAX)
        {
            let api = routes
                .get(&l.agent)
                .is_some_and(|r| matches!(r.adapter.as_str(), "openai" | "anthropic"));
            if api {
                held.push(Held {
                    hold: hold_id(),
                    kind: "model_request".into(),
                    item: l.id,
                    agent: Some(l.agent),
                    task: None,
                });
            }
        }
        Ok(held)
    }

    /// Let a cancelled room dispatch again (its dead letters stay dead).
    pub fn room_resume(&self, c: &Control, room: &str) -> Outcome<Value> {
        let handle = self.room_handle(room)?;
        let mut h = lock_room(&handle);
        h.writable()?;
        let cancelled = self
            .control()
            .room(room)
            .map_err(store_err)?
            .is_some_and(|r| r.cancelled);
        if !cancelled {
            return Err(Refusal::invalid(
                "room",
                format!("room {room} is not cancelled"),
            ));
        }
        let rec = h.commit(
            self,
            vec![EventBody::RoomResumed {
                actor: c.actor.clone(),
            }],
            None,
        )?;
        Ok(json!({"room": room, "cancelled": false, "event": rec[0].id, "cancel_gen": rec[0].seq}))
    }

    /// The room's held items, resolved or not.
    pub fn holds_view(&self, _c: &Control, room: &str) -> Outcome<Value> {
        self.room_handle(room)?;
        let holds = self
            .control()
            .holds(room, room_store::control::HOLDS_PAGE_MAX)
            .map_err(store_err)?;
        let open = holds.iter().filter(|h| h.resolved_seq.is_none()).count();
        let rows: Vec<Value> = holds.iter().map(hold_view).collect();
        Ok(json!({"room": room, "holds": rows, "unresolved": open}))
    }

    /// Resolve a held item with evidence, as a journal record.
    pub fn reconcile(
        &self,
        c: &Control,
        room: &str,
        hold: &str,
        outcome: &str,
        evidence: &str,
    ) -> Outcome<Value> {
        if !RECONCILE_OUTCOMES.contains(&outcome) {
            return Err(Refusal::invalid(
                "outcome",
                format!("must be one of {}", RECONCILE_OUTCOMES.join(", ")),
            ));
        }
        if evidence.trim().is_empty() || evidence.len() > RECONCILE_EVIDENCE_BYTES_MAX {
            return Err(Refusal::invalid(
                "evidence",
                format!("must be 1 to {RECONCILE_EVIDENCE_BYTES_MAX} bytes of what shows it"),
            ));
        }
        let handle = self.room_handle(room)?;
        let mut h = lock_room(&handle);
        h.writable()?;
        let row = self.control().hold(hold).map_err(store_err)?;
        let row = row.filter(|r| r.room == room).ok_or_else(|| {
            Refusal::new(Code::NotFound, format!("no hold {hold:?} in room {room}"))
        })?;
        if row.resolved_seq.is_some() {
            return Err(Refusal::invalid(
                "hold",
                format!("hold {hold} is already reconciled"),
            ));
        }
        let rec = h.commit(
            self,
            vec![EventBody::Reconciled {
                actor: c.actor.clone(),
                hold: hold.into(),
                outcome: outcome.into(),
                evidence: evidence.into(),
            }],
            None,
        )?;
        let now = self.control().hold(hold).map_err(store_err)?;
        Ok(json!({"room": room, "event": rec[0].id, "hold": now.as_ref().map(hold_view)}))
    }

    /// Engage or release break-glass. Either advances the control epoch: every permit sealed
    /// before dies at dispatch, and the observer stops every worker started before.
    pub fn break_glass(&self, c: &Control, engage: bool) -> Outcome<Value> {
        let mut ctl = self.control();
        let engaged = ctl.break_glass().map_err(store_err)?;
        if engaged == engage {
            let state = if engaged { "engaged" } else { "released" };
            return Err(Refusal::invalid(
                "engage",
                format!("break-glass is already {state}"),
            ));
        }
        let epoch = ctl.set_break_glass(engage).map_err(store_err)?;
        drop(ctl);
        tracing::warn!(actor = %c.actor, engage, epoch, "break-glass");
        Ok(json!({"break_glass": engage, "control_epoch": epoch, "actor": c.actor}))
    }

    /// The launches that no longer have their authority, each with the first reason found:
    /// break-glass, a moved control epoch, their room gone, cancelled or closed, their agent
    /// revoked, re-registered or off the roster. The observer stops each.
    pub fn launch_trips(&self) -> Outcome<Vec<Trip>> {
        let c = self.control();
        let live = c.launches_live().map_err(store_err)?;
        let epoch = c.control_epoch().map_err(store_err)?;
        let glass = c.break_glass().map_err(store_err)?;
        let mut out = Vec::new();
        for l in live
            .into_iter()
            .filter(|l| l.state == "starting" || l.state == "running")
        {
            out.extend(trip_of(&**c, &l, epoch, glass)?);
        }
        Ok(out)
    }

    /// The trip of one launch whatever its state: why its authority no longer stands, or
    /// none. A launch whose claim was refused because a cancel (or another trip) came first
    /// is stopped as the observer would have stopped it, through the stop outbox.
    pub fn launch_trip(&self, id: &str) -> Outcome<Option<Trip>> {
        let c = self.control();
        let Some(l) = c.launch(id).map_err(store_err)? else {
            return Ok(None);
        };
        let epoch = c.control_epoch().map_err(store_err)?;
        let glass = c.break_glass().map_err(store_err)?;
        trip_of(&**c, &l, epoch, glass)
    }

    /// Phase 1 of a stop: the record committed before the job is killed. Writes nothing.
    pub fn stop_phase1(&self, t: &Trip) -> StopEnvelope {
        let now = self.now_ms();
        let hlc = room_core::hlc::Hlc { ms: now, c: 0 };
        let stop = format!("stp_{}", self.env.entropy.hex(16));
        let s = WorkerStop {
            actor: "room".into(),
            stop,
            phase: 1,
            launch: t.launch.clone(),
            agent: t.agent.clone(),
            reason: t.reason.into(),
            termination_confirmed: false,
            pending: Some(bounded(&t.detail, STOP_PENDING_BYTES_MAX)),
            predecessor: None,
            observed: Value::Null,
        };
        StopEnvelope::of(&t.room, id::event_id(hlc, self.env.entropy.as_ref()), s)
    }

    /// Phase 2: zero processes were observed in the job (`observed` says how).
    pub fn stop_phase2(&self, p1: &StopEnvelope, observed: Value) -> Outcome<StopEnvelope> {
        assert_eq!(
            observed["confirmed_empty"], true,
            "phase 2 is written only after zero processes were observed"
        );
        let first = p1.record()?;
        let hlc = room_core::hlc::Hlc {
            ms: self.now_ms(),
            c: 0,
        };
        let s = WorkerStop {
            phase: 2,
            termination_confirmed: true,
            pending: None,
            predecessor: Some(StopPredecessor {
                event_id: p1.event_id.clone(),
                envelope_sha256: p1.envelope_sha256.clone(),
            }),
            observed,
            ..first
        };
        Ok(StopEnvelope::of(
            &p1.room,
            id::event_id(hlc, self.env.entropy.as_ref()),
            s,
        ))
    }

    /// Commit a stop record under its drawn id, once: false when the journal already holds it
    /// (a replay). A phase 2 commits only after its exact phase 1 (same id, same envelope).
    pub fn stop_commit(&self, e: &StopEnvelope) -> Outcome<bool> {
        let rec = e.record()?;
        let handle = self.room_handle(&e.room)?;
        let mut h = lock_room(&handle);
        if h.index
            .event_by_id(&e.event_id)
            .map_err(store_err)?
            .is_some()
        {
            return Ok(false);
        }
        if rec.phase == 2 {
            let pred = rec.predecessor.as_ref().ok_or_else(|| {
                Refusal::storage(format!("stop {}: phase 2 names no phase 1", e.stop))
            })?;
            let first = h
                .index
                .event_by_id(&pred.event_id)
                .map_err(store_err)?
                .ok_or_else(|| {
                    Refusal::storage(format!(
                        "stop {}: phase 2 before its phase 1 {} was committed",
                        e.stop, pred.event_id
                    ))
                })?;
            let body: Value = serde_json::from_str(&first.body).map_err(Refusal::storage)?;
            if canon::digest_of(&body) != pred.envelope_sha256 {
                return Err(Refusal::storage(format!(
                    "stop {}: the committed phase 1 is not the one phase 2 names",
                    e.stop
                )));
            }
        }
        h.commit_as(
            self,
            EventBody::WorkerStop(Box::new(rec)),
            e.event_id.clone(),
        )?;
        Ok(true)
    }
}

fn held_view(held: &[Held]) -> Vec<Value> {
    held.iter()
        .map(|h| {
            json!({"hold": h.hold, "kind": h.kind, "item": h.item, "agent": h.agent,
                "task": h.task, "held_until_reconciled": true})
        })
        .collect()
}

fn hold_view(h: &room_store::control::HoldRow) -> Value {
    json!({"hold": h.id, "kind": h.kind, "item": h.item, "agent": h.agent, "task": h.task,
        "cancel_seq": h.cancel_seq, "created_ms": h.created_ms,
        "held_until_reconciled": h.resolved_seq.is_none(),
        "reconciled": h.resolved_seq.map(|seq| json!({"seq": seq, "at_ms": h.resolved_ms,
            "by": h.resolved_by, "outcome": h.outcome, "evidence": h.evidence}))})
}

/// Why `l`'s authority no longer stands (the first reason found), or none.
fn trip_of(
    c: &dyn room_store::ControlStore,
    l: &room_store::control::LaunchRow,
    epoch: u64,
    glass: bool,
) -> Outcome<Option<Trip>> {
    let room = c.room(&l.room).map_err(store_err)?;
    let agent = c.agent(&l.agent).map_err(store_err)?;
    let member = c.is_member(&l.room, &l.agent).map_err(store_err)?;
    let sealed = c
        .wake(&l.room, &l.agent, &l.source_event)
        .map_err(store_err)?
        .and_then(|w| serde_json::from_str::<room_core::wake::WakePermit>(&w.permit).ok())
        .map(|p| p.binding.registration_sha256);
    let trip = |reason: &'static str, detail: String| Trip {
        launch: l.id.clone(),
        room: l.room.clone(),
        agent: l.agent.clone(),
        reason,
        detail,
    };
    let t = if glass {
        Some(trip("break_glass", "break-glass is engaged".into()))
    } else if epoch != l.control_epoch {
        Some(trip(
            "control_epoch_changed",
            format!("control epoch {epoch}, launched under {}", l.control_epoch),
        ))
    } else if let Some(r) = room.as_ref().filter(|r| r.archived_ms.is_none()) {
        if r.cancel_gen != l.cancel_gen {
            Some(trip(
                "room_cancelled",
                format!(
                    "room {} moved to cancel generation {} (launched under {})",
                    r.name, r.cancel_gen, l.cancel_gen
                ),
            ))
        } else if !r.admission_open {
            Some(trip(
                "admission_closed",
                format!("room {} admission closed", r.name),
            ))
        } else {
            None
        }
    } else {
        Some(trip(
            "room_gone",
            format!("room {} is gone or archived", l.room),
        ))
    };
    let t = t.or_else(|| {
        let ok = agent.as_ref().is_some_and(|a| {
            a.revoked_ms.is_none() && sealed.as_deref() == Some(&a.registration_sha256)
        }) && member;
        (!ok).then(|| {
            trip(
                "worker_authority_changed",
                format!("{} was revoked, re-registered or removed", l.agent),
            )
        })
    });
    // the task it works on, or an ancestor, withdrawn by its owner (`task_cancel`)
    let t = match t {
        None => crate::dispatch::launch_task_cancelled(c, l)?.map(|task| {
            trip(
                "task_cancelled",
                format!("task {task} was cancelled by its owner"),
            )
        }),
        t => t,
    };
    // the request permit of a running launch: the permit it was claimed with
    let t = match t {
        None if l.state == "running" && !crate::dispatch::permit_stands(c, l)? => Some(trip(
            "permit_changed",
            format!(
                "the permit launch {} was claimed with changed or is gone",
                l.id
            ),
        )),
        t => t,
    };
    Ok(t)
}
