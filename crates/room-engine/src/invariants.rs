//! The five runtime invariants, checked on the append path under the room's writer lock, after
//! the verb's own checks and the Work Gate. The gates decide whether an act may proceed; these
//! check the event stream's structure independently of them, from state projected from the
//! journal (the `idempotency` and `lifecycles` tables of the sync index, the task rows of
//! control.db), so they hold across crashes and replays.
//!
//! | invariant | state | verdict |
//! |---|---|---|
//! | `exactly_once` | per-room FIFO registry of (actor, idempotency key), newest 10,000 | reject |
//! | `well_formed` | lifecycle per (agent, task): claim (begin) → note/send (effect) → done (resolve) | reject |
//! | `exclusive` | live leases: claimed tasks' typed scopes in one project (or room) | reject (`lease_conflict`) |
//! | `causal` | the destination ledger: an operation begun on a parent not yet resolved | flag |
//! | `resolution` | begun lifecycles past their TTL without resolution | in doubt |
//!
//! Beside them, `children_open` flags a task closed over unsettled subtasks (journals written
//! before it had its own name record it as `causal`).
//!
//! A rejected act is recorded as an `invariant_violation` record without its envelope; a flag is
//! committed in the same batch as the act it stands beside; a lapse is recorded by the sweep.
//! Exactly-once here means event registration, not exactly-once external effect.

use crate::event::{EventBody, Invariant, Severity, TaskEvent, TaskStatus, Turn, Violation};
use crate::room::RoomHandle;
use crate::{Engine, Outcome, lock_room, store_err};
use room_core::scope::{self, Scope};
use room_core::{Code, Refusal, Verb};
use serde_json::{Value, json};

/// Idempotency keys: what a client may use (a UUID, a ULID, `build-42:retry`).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 128;
/// The shape `check_key` accepts, as a regular expression (for schemas; the check itself
/// compares bytes).
pub const IDEMPOTENCY_KEY_PATTERN: &str = "^[A-Za-z0-9._:-]+$";
/// Claim TTL bounds for `resolution`.
pub const CLAIM_TTL_MS_MIN: u64 = 1_000;
pub const CLAIM_TTL_MS_MAX: u64 = 7 * 24 * 3_600_000;
/// Lapses one sweep records per room, so a sweep stays short under the room lock.
const LAPSES_PER_SWEEP_MAX: usize = 64;
/// Rejections of one actor recorded per room within `VIOLATION_WINDOW_MS`; later ones within
/// the window are refused the same way but leave no record.
pub const VIOLATION_RECORDS_PER_WINDOW_MAX: usize = 16;
pub const VIOLATION_WINDOW_MS: u64 = 60_000;
/// Recent rejections remembered per room for that count.
const VIOLATIONS_TRACKED_MAX: usize = 4_096;
/// (actor, invariant) pairs whose suppressed rejections one room counts at once; past it the
/// oldest pair's aggregate is written early.
const SUPPRESSED_TRACKED_MAX: usize = 1_024;

/// Rejections the flood bound left unrecorded, counted for their aggregate record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Suppressed {
    pub count: u64,
    pub first_ms: u64,
    pub last_ms: u64,
}

/// Validate a client's idempotency key at the edge of the engine.
pub fn check_key(key: Option<&str>) -> Outcome<()> {
    let Some(k) = key else { return Ok(()) };
    if k.is_empty()
        || k.len() > IDEMPOTENCY_KEY_BYTES_MAX
        || !k
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    {
        return Err(Refusal::invalid(
            "idempotency_key",
            format!("must be 1..={IDEMPOTENCY_KEY_BYTES_MAX} of A-Z a-z 0-9 - _ . :"),
        ));
    }
    Ok(())
}

pub fn check_ttl(ttl_ms: Option<u64>) -> Outcome<()> {
    match ttl_ms {
        Some(t) if !(CLAIM_TTL_MS_MIN..=CLAIM_TTL_MS_MAX).contains(&t) => Err(Refusal::invalid(
            "ttl_ms",
            format!("must be {CLAIM_TTL_MS_MIN}..={CLAIM_TTL_MS_MAX} milliseconds"),
        )),
        _ => Ok(()),
    }
}

fn violation(
    actor: &str,
    invariant: Invariant,
    severity: Severity,
    act: &str,
    task: Option<&str>,
    detail: Value,
) -> Box<Violation> {
    Box::new(Violation {
        actor: actor.into(),
        invariant,
        severity,
        act: act.into(),
        task: task.map(String::from),
        event: None,
        detail,
        audience: Vec::new(),
    })
}

/// Why a check did not pass: the act breaks an invariant (recorded, then refused), or the state
/// that decides it could not be read (refused as a storage failure, nothing recorded: a broken
/// disk is not the agent's violation).
pub(crate) enum Check {
    Reject(Box<Violation>),
    Failed(Refusal),
}

impl From<Box<Violation>> for Check {
    fn from(v: Box<Violation>) -> Check {
        Check::Reject(v)
    }
}

fn failed(e: room_store::StoreError) -> Check {
    Check::Failed(store_err(e))
}

impl Engine {
    /// Turn a failed check into the caller's refusal (recording a rejection first).
    pub(crate) fn refuse_check(&self, h: &mut RoomHandle, c: Check) -> Refusal {
        match c {
            Check::Reject(v) => self.reject(h, *v),
            Check::Failed(r) => r,
        }
    }

    /// `exactly_once`: a key this actor already registered in this room is a repeat.
    pub(crate) fn check_exactly_once(
        &self,
        h: &RoomHandle,
        actor: &str,
        act: &str,
        key: Option<&str>,
        task: Option<&str>,
    ) -> Result<(), Check> {
        let Some(key) = key else { return Ok(()) };
        if self.config.skip_invariants || crate::planted::bug("04-C12") {
            return Ok(());
        }
        let found = h.index.idempotent(actor, key).map_err(failed)?;
        match found {
            None => Ok(()),
            Some((event, seq, original_task)) => {
                // the record names the first call's event: withheld wherever that event is
                let audience = match h.index.event_by_id(&event).map_err(failed)? {
                    Some(e) => crate::visibility::audience_of(&e).map_err(Check::Failed)?,
                    None => Vec::new(),
                };
                let mut v = violation(
                    actor,
                    Invariant::ExactlyOnce,
                    Severity::Reject,
                    act,
                    task,
                    json!({"key": key, "original_event": event, "original_seq": seq, "original_task": original_task}),
                );
                v.audience = audience;
                Err(Check::Reject(v))
            }
        }
    }

    /// Check a turn about to be committed. `Err` is a rejection; `Ok` carries flags to commit
    /// beside it.
    pub(crate) fn check_turn(&self, h: &RoomHandle, t: &Turn) -> Result<Vec<Violation>, Check> {
        let act = t.verb.as_str();
        self.check_exactly_once(
            h,
            &t.actor,
            act,
            t.idempotency_key.as_deref(),
            t.task.as_deref(),
        )?;
        let Some(task) = t.task.as_deref() else {
            return Ok(Vec::new());
        };
        if self.config.skip_invariants {
            return Ok(Vec::new());
        }
        let row = self.control().task(task).map_err(failed)?;
        let life = h.index.lifecycle(&t.actor, task).map_err(failed)?;
        let begun = life.as_ref().is_some_and(|l| l.state == "begun");
        let ill = |why: &str| {
            violation(
                &t.actor,
                Invariant::WellFormed,
                Severity::Reject,
                act,
                Some(task),
                json!({"why": why, "lifecycle": life.as_ref().map(|l| l.state.clone())}),
            )
        };
        // `done` resolves a lifecycle its actor began; an effect on a task by the task's own
        // recipient happens inside a begun lifecycle.
        if t.verb == Verb::Done && !begun {
            return Err(ill(
                "done resolves a task only inside a lifecycle its actor began with a claim",
            )
            .into());
        }
        let recipient = row.as_ref().and_then(|r| r.recipient.as_deref());
        if matches!(t.verb, Verb::Note | Verb::Send)
            && recipient == Some(t.actor.as_str())
            && !begun
        {
            return Err(ill(
                "an effect on your own task needs a begun lifecycle: claim the task first",
            )
            .into());
        }
        let mut flags = Vec::new();
        if t.verb == Verb::Done {
            let children = self.control().children(task).map_err(failed)?;
            let open: Vec<Value> = children
                .iter()
                .filter(|c| !c.status.is_settled())
                .map(|c| json!({"task": c.id, "status": c.status}))
                .collect();
            if !open.is_empty() {
                flags.push(*violation(
                    &t.actor,
                    Invariant::ChildrenOpen,
                    Severity::Flag,
                    act,
                    Some(task),
                    json!({"unresolved_children": open}),
                ));
            }
        }
        Ok(flags)
    }

    /// Check a task event about to be committed: a repeated creation key, or a claim whose
    /// scopes another live holder leases.
    pub(crate) fn check_task_event(
        &self,
        h: &RoomHandle,
        te: &TaskEvent,
        project: Option<&str>,
        scopes: &[String],
    ) -> Result<(), Check> {
        let act = if te.created.is_some() {
            "task_create"
        } else {
            "task_claim"
        };
        self.check_exactly_once(
            h,
            &te.actor,
            act,
            te.idempotency_key.as_deref(),
            Some(&te.task),
        )?;
        let claiming = te
            .transition
            .as_ref()
            .is_some_and(|t| t.to == TaskStatus::Claimed);
        if !claiming || scopes.is_empty() || self.config.skip_invariants {
            return Ok(());
        }
        let mine: Vec<Scope> = scopes
            .iter()
            .filter_map(|s| Scope::parse("scopes", s).ok())
            .collect();
        let leased = self
            .control()
            .leased_over(project, &h.name, &mine)
            .map_err(failed)?;
        let mut conflicts = Vec::new();
        for other in leased
            .iter()
            .filter(|o| o.id != te.task && o.recipient.as_deref() != Some(te.actor.as_str()))
        {
            for theirs in other
                .scopes
                .iter()
                .filter_map(|s| Scope::parse("scopes", s).ok())
            {
                if let Some(m) = mine.iter().find(|m| m.conflicts(&theirs)) {
                    // a lease in another room of the project is named, not described (not its
                    // holder, task or scope, which may be a path more specific than the caller's):
                    // the caller may not be a member there
                    conflicts.push(if other.room == h.name {
                        json!({"scope": m.to_string(), "held_scope": theirs.to_string(),
                            "task": other.id, "holder": other.recipient})
                    } else {
                        json!({"scope": m.to_string(), "elsewhere": "another room of this project"})
                    });
                }
            }
        }
        if conflicts.is_empty() {
            return Ok(());
        }
        Err(violation(
            &te.actor,
            Invariant::Exclusive,
            Severity::Reject,
            act,
            Some(&te.task),
            json!({"conflicts": conflicts}),
        )
        .into())
    }

    /// Record a rejected act's violation (never its envelope) and turn it into the refusal the
    /// caller gets. If even the record cannot be written, the refusal says so.
    pub(crate) fn reject(&self, h: &mut RoomHandle, v: Violation) -> Refusal {
        let message = match v.invariant {
            Invariant::ExactlyOnce => format!(
                "idempotency key {} was already used by {} in this room; the act was not repeated",
                v.detail["key"].as_str().unwrap_or_default(),
                v.actor
            ),
            Invariant::WellFormed => format!(
                "{} by {} is not well formed: {}",
                v.act,
                v.actor,
                v.detail["why"].as_str().unwrap_or_default()
            ),
            Invariant::Exclusive => {
                let c = &v.detail["conflicts"][0];
                format!(
                    "{} would conflict with {}'s live lease on {} (scope {})",
                    v.act,
                    c["holder"].as_str().unwrap_or("another holder"),
                    c["held_scope"].as_str().unwrap_or("an overlapping scope"),
                    c["scope"].as_str().unwrap_or("?"),
                )
            }
            Invariant::Causal | Invariant::Resolution | Invariant::ChildrenOpen => {
                format!("{} violates {}", v.act, v.invariant.as_str())
            }
        };
        let hint = match v.invariant {
            Invariant::ExactlyOnce => {
                "your earlier call landed as detail.original_event; sync to read it instead of repeating"
            }
            Invariant::WellFormed => "claim the task (task_claim) before acting on it",
            Invariant::Exclusive => {
                "wait for the holder to finish (done, blocked or handoff), or narrow this task's scopes"
            }
            Invariant::Causal | Invariant::Resolution | Invariant::ChildrenOpen => {
                "see the invariant_violation record in the room"
            }
        };
        // a claim that meets a live holder is the `exclusive` invariant's reject, recorded as
        // every reject is, and answered with the code a caller acts on
        let code = match v.invariant {
            Invariant::Exclusive => Code::LeaseConflict,
            _ => Code::InvariantViolation,
        };
        let mut detail = json!({"invariant": v.invariant.as_str(), "severity": "reject"});
        if let (Some(d), Some(extra)) = (detail.as_object_mut(), v.detail.as_object()) {
            d.extend(extra.clone());
        }
        if !self.may_record_violation(h, &v.actor) {
            // an agent repeating a refused call in a loop must not fill the journal: the
            // refusal stands, its own record is left out and counted into one aggregate
            // record per window (written by the sweep once the window has passed)
            self.suppress(h, &v);
            detail["violation_recorded"] = json!("rate_limited");
            return Refusal::new(code, message)
                .detail(detail)
                .hint(format!(
                    "{hint}; {VIOLATION_RECORDS_PER_WINDOW_MAX} rejections of yours were recorded in this room within {} s, so this one was not",
                    VIOLATION_WINDOW_MS / 1000
                ));
        }
        match h.commit(self, vec![EventBody::InvariantViolation(v)], None) {
            Ok(rec) => detail["violation_event"] = json!(rec[0].id),
            Err(r) => {
                tracing::error!(room = %h.name, "an invariant violation could not be recorded: {r}");
                // the act itself was refused either way; whether its record landed may be unknown
                detail["violation_recorded"] = if r.detail["in_doubt"] == true {
                    json!("in_doubt")
                } else {
                    json!(false)
                };
            }
        }
        Refusal::new(code, message).detail(detail).hint(hint)
    }

    /// Whether a rejection of `actor`'s may be recorded now: at most
    /// `VIOLATION_RECORDS_PER_WINDOW_MAX` per actor and room within `VIOLATION_WINDOW_MS`.
    /// Counted in memory: a restart forgets the window, which only lets a few more through.
    fn may_record_violation(&self, h: &mut RoomHandle, actor: &str) -> bool {
        let now = self.now_ms();
        let recent = &mut h.violations_recent;
        while recent
            .front()
            .is_some_and(|(_, at)| at.saturating_add(VIOLATION_WINDOW_MS) <= now)
        {
            recent.pop_front();
        }
        let mine = recent.iter().filter(|(a, _)| a == actor).count();
        if mine >= VIOLATION_RECORDS_PER_WINDOW_MAX {
            return false;
        }
        if recent.len() >= VIOLATIONS_TRACKED_MAX {
            recent.pop_front();
        }
        recent.push_back((actor.to_string(), now));
        true
    }

    fn suppress(&self, h: &mut RoomHandle, v: &Violation) {
        let now = self.now_ms();
        let key = (v.actor.clone(), v.invariant);
        if !h.violations_suppressed.contains_key(&key)
            && h.violations_suppressed.len() >= SUPPRESSED_TRACKED_MAX
        {
            // bounded: the pair counting longest is written now, early
            if let Some(oldest) = h
                .violations_suppressed
                .iter()
                .min_by_key(|(_, s)| s.first_ms)
                .map(|(k, _)| k.clone())
            {
                let s = h.violations_suppressed.remove(&oldest).expect("just found");
                let _ = self.write_aggregate(h, &oldest, s);
            }
        }
        let s = h.violations_suppressed.entry(key).or_insert(Suppressed {
            count: 0,
            first_ms: now,
            last_ms: now,
        });
        s.count += 1;
        s.last_ms = now;
    }

    /// The one record standing for rejections the flood bound left out.
    fn write_aggregate(
        &self,
        h: &mut RoomHandle,
        (actor, invariant): &(String, Invariant),
        s: Suppressed,
    ) -> Outcome<()> {
        let v = Violation {
            actor: actor.clone(),
            invariant: *invariant,
            severity: Severity::Reject,
            act: "suppressed".into(),
            task: None,
            event: None,
            detail: json!({"suppressed": s.count, "first_ms": s.first_ms, "last_ms": s.last_ms,
                "window_ms": VIOLATION_WINDOW_MS,
                "why": format!("{} rejections past {VIOLATION_RECORDS_PER_WINDOW_MAX} per {} s were refused without records of their own",
                    s.count, VIOLATION_WINDOW_MS / 1000)}),
            audience: Vec::new(),
        };
        h.commit(self, vec![EventBody::InvariantViolation(v)], None)?;
        Ok(())
    }

    /// Write the aggregates whose window has passed.
    pub(crate) fn flush_suppressed(&self, h: &mut RoomHandle, now: u64) -> Outcome<u64> {
        let due: Vec<(String, Invariant)> = h
            .violations_suppressed
            .iter()
            .filter(|(_, s)| s.first_ms.saturating_add(VIOLATION_WINDOW_MS) <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut written = 0;
        for k in due {
            let s = h.violations_suppressed.remove(&k).expect("listed above");
            self.write_aggregate(h, &k, s)?;
            written += 1;
        }
        Ok(written)
    }

    /// `resolution`: record every begun lifecycle whose TTL has run out unresolved as in doubt
    /// (once each). The daemon calls this on a timer; the simulator between steps. Returns how
    /// many lapses were recorded.
    pub fn sweep_invariants(&self) -> Outcome<u64> {
        let now = self.now_ms();
        // in name order: a sweep's appends draw ids from the entropy source, so a seeded
        // simulation replays only if the order is stable
        // the open rooms and every room holding a claim (only a claim begins a lifecycle
        // that can lapse), so a room closed to save descriptors is swept all the same
        let mut names: std::collections::BTreeSet<String> =
            self.rooms.named().into_iter().map(|(n, _)| n).collect();
        names.extend(self.control().rooms_with_claims().map_err(store_err)?);
        let mut recorded = 0;
        let mut first_error = None;
        // one room that cannot be swept must not keep the others from it
        for name in names {
            let handle = match self.room_handle(&name) {
                Ok(h) => h,
                Err(r) => {
                    tracing::error!(room = %name, "invariant sweep: {r}");
                    first_error.get_or_insert(r);
                    continue;
                }
            };
            let mut h = lock_room(&handle);
            if h.writable().is_err() {
                continue;
            }
            match self.sweep_room(&mut h, now) {
                Ok(n) => recorded += n,
                Err(r) => {
                    tracing::error!(room = %h.name, "invariant sweep: {r}");
                    first_error.get_or_insert(r);
                }
            }
        }
        match first_error {
            Some(r) => Err(r),
            None => Ok(recorded),
        }
    }

    fn sweep_room(&self, h: &mut RoomHandle, now: u64) -> Outcome<u64> {
        self.flush_suppressed(h, now)?;
        let ops = self.sweep_ops(h, now, LAPSES_PER_SWEEP_MAX)?;
        let lapsed = h
            .index
            .lapsed_begins(now, LAPSES_PER_SWEEP_MAX)
            .map_err(store_err)?;
        let mut recorded = 0;
        for l in lapsed {
            let claim = h
                .index
                .event_by_seq(l.began_seq)
                .map_err(store_err)?
                .map(|e| e.id);
            let mut detail = json!({"began_ms": l.began_ms, "ttl_ms": l.ttl_ms,
                "elapsed_ms": now.saturating_sub(l.began_ms), "observation": "unresolved"});
            // the lapsed claim's lease goes back through the one release path (its projection)
            let row = self.control().task(&l.task).map_err(store_err)?;
            if let Some(t) =
                row.filter(|t| t.lease_held && t.recipient.as_deref() == Some(l.agent.as_str()))
            {
                detail["lease_generation"] = json!(t.lease_gen);
                detail["lease_released"] = json!(true);
            }
            let v = Violation {
                actor: l.agent.clone(),
                invariant: Invariant::Resolution,
                severity: Severity::InDoubt,
                act: "task_claim".into(),
                task: Some(l.task.clone()),
                event: claim,
                detail,
                audience: Vec::new(),
            };
            h.commit(self, vec![EventBody::InvariantViolation(v)], None)?;
            recorded += 1;
        }
        Ok(recorded + ops)
    }
}

/// Parse a task's scopes (for `task_create`).
pub fn parse_scopes(list: &[String]) -> Outcome<Vec<String>> {
    Ok(scope::parse_list("scopes", list)?
        .iter()
        .map(ToString::to_string)
        .collect())
}
