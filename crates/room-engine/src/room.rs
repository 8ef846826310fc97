//! One room's shard on disk and its write path. The handle owns the journal (the commit
//! point), the sync index and the blobs. A turn is sealed, appended and fdatasync'ed, then
//! projected; derived state (index rows, task effects, flush 2, wake permits) is caught up
//! from the journal at open, so a crash anywhere after the append loses nothing.

use crate::event::{
    Binding, EventBody, Invariant, ItemSpec, Items, TaskStatus, TaskTransition, item_id,
};
use crate::{Engine, Outcome, store_err};
use room_core::chain::ChainTip;
use room_core::event::{OpPhase, SeqWitness};
use room_core::wake::TASKED_DEADLINE_MS;
use room_core::{Code, Record, Refusal, Sealed, canon, id};
use room_store::control::{RoomRow, TaskRow, WakeRow};
use room_store::index::{
    Batch, CheckpointRow, EventRow, EvidenceRow, FoldAdvance, ItemKind, ItemRow, LifecycleChange,
    LogTrust, OpChange, OpRow,
};
use room_store::journal::{ChainPos, JournalMark, RECORD_BYTES_MAX};
use room_store::{BlobStore, RoomIndex, RoomLog, ShardCreated, StoreError};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Bytes of journal the background scrub verifies per call of `Engine::scrub_step` (the daemon
/// calls it every `SCRUB_EVERY_MS`): see ARCHITECTURE.md for the rate this gives.
pub const SCRUB_SLICE_BYTES: u64 = 16 << 20;
/// A room whose whole journal was scrubbed is scrubbed again after this long.
pub const SCRUB_REPEAT_MS: u64 = 6 * 3600 * 1000;

/// Why a room's journal is not trusted: a record that does not verify, or acknowledged
/// records it lacks. The room is read-only and never extended until the owner restores the
/// journal or accepts the loss (`room index rebuild --accept-loss`).
#[derive(Debug, Clone, Serialize)]
pub struct Quarantine {
    pub reason: String,
    /// Acknowledged seqs the journal lacks: `[first, last]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<(u64, u64)>,
    /// What showed they had been acknowledged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub witnesses: Vec<SeqWitness>,
}

/// The background scrub's place in one room's journal.
#[derive(Debug, Default)]
pub(crate) struct Scrub {
    /// Verified from the first record up to here in this pass (`None`: not begun).
    pos: Option<ChainPos>,
    /// When the last pass ended.
    done_ms: Option<u64>,
}

/// Acknowledged seqs a journal lacks (`[first, last]`) and every witness read.
type Missing = ((u64, u64), Vec<SeqWitness>);

/// What `rebuild_checked` found missing, for the `journal_loss` record that accepts it.
pub(crate) struct Loss {
    pub from: u64,
    pub to: u64,
    pub witnesses: Vec<SeqWitness>,
}

/// Catch-up applies the projection in slices of this many records.
const CATCH_UP_SLICE: usize = 512;

pub struct RoomHandle {
    pub name: String,
    pub graph_id: String,
    pub binding: Binding,
    pub journal: Option<Box<dyn RoomLog>>,
    pub index: Box<dyn RoomIndex>,
    pub blobs: Arc<dyn BlobStore>,
    /// Why the room refuses writes, when it does (a rotated journal, a failed projection).
    pub read_only: Option<String>,
    /// The owner archived the room: it refuses turns (`room_archived`) and serves reads.
    pub archived: bool,
    /// What each agent wrote here within the quota window (the room lock guards it).
    pub(crate) written: crate::quota::Written,
    /// True when `read_only` is a rotated or replaced journal (the owner's `index rebuild`
    /// accepts it); otherwise a restart catches the room up from its journal.
    pub rotated: bool,
    /// Writes are refused until the room is caught up from its log: at a restart, or by
    /// closing and opening it again where the store allows (`Engine::heal_halted_rooms`).
    pub halted: bool,
    /// Another writer (a daemon beside this one on a shared database) appended to the room
    /// after this handle read it: the handle is halted, and its next use opens the room anew
    /// from the store rather than waiting for the heal timer.
    pub moved: bool,
    /// Set when the journal does not verify or lacks acknowledged records (`read_only` is set
    /// too): turns are refused `room_quarantined` until the owner restores or accepts.
    pub quarantine: Option<Quarantine>,
    /// The chain is known good from its first record up to here (read back from the file).
    verified: Option<ChainPos>,
    pub(crate) scrub: Scrub,
    /// Recent sync renderings (the room lock guards it).
    pub(crate) rendered: std::cell::RefCell<crate::sync::RenderCache>,
    /// Wake permits sealed since the last time the queue was written (`Engine::flush_wakes`).
    pub(crate) wakes_pending: Vec<WakeRow>,
    /// Every permit of an items record up to this seq is durable.
    wakes_mark: u64,
    /// When this room recorded its recent rejections, and whose (see `invariants::reject`).
    pub(crate) violations_recent: std::collections::VecDeque<(String, u64)>,
    /// Rejections left unrecorded by that bound, per (actor, invariant), until their one
    /// aggregate record is written.
    pub(crate) violations_suppressed: std::collections::BTreeMap<
        (String, crate::event::Invariant),
        crate::invariants::Suppressed,
    >,
    /// Who writes next in this room when many wait (not persisted: a reopened room starts
    /// with an empty queue, and its waiters queue again).
    pub(crate) turnstile: crate::turnstile::Turnstile,
}

/// Lag after which the wakes mark is moved up even when no permit waits for a sync.
const WAKES_MARK_LAG_MAX: u64 = 256;
/// Items records re-derived per query at start.
const REDERIVE_SLICE: usize = 512;

pub fn binding_of(row: &RoomRow) -> Binding {
    match &row.project_id {
        Some(id) => Binding::Project { id: id.clone() },
        None => Binding::Coordination,
    }
}

/// Derive the shard directory name from the instance and room name.
pub fn graph_id(instance: &str, room: &str) -> String {
    let d = room_core::sha256_hex(format!("room-graph:{instance}:{room}").as_bytes());
    format!("g_{}", &d[..32])
}

/// What one record changes: index rows and task effects.
#[derive(Debug)]
pub(crate) struct Projection {
    pub batch: Batch,
    pub tasks: Vec<TaskEffect>,
}

/// What a record changes in control.db. Applied at commit and again at catch-up, so each is
/// idempotent: a crash between the journal append and control.db loses nothing.
#[derive(Debug)]
pub(crate) enum TaskEffect {
    Create(Box<TaskRow>),
    /// A transition; the task then holds a lease of this generation, or none.
    Transition(TaskTransition, Option<u64>),
    /// A lapsed claim's lease of this generation is released (the task stays in doubt).
    ReleaseLease {
        task: String,
        generation: u64,
    },
    /// An amendment's new terms (no-op once the task is at their revision).
    Terms(String, room_core::event::TaskTerms),
    /// The authority keys a claim pinned.
    Pin(String, BTreeMap<String, String>),
    /// An operator's acceptance override and its reason.
    Override(String, String),
    /// A superseded task's verified successor.
    Successor(String, String),
    /// A proposal the daemon applied moves the staging pin of its source, from the digest
    /// it replaced to the one it wrote (so the task's next worker stages the file as it is).
    StagePin {
        task: String,
        path: String,
        from: String,
        to: String,
    },
    /// The room's admission opens or closes as of this record's seq.
    Admission {
        room: String,
        seq: u64,
        open: bool,
    },
    /// A member joins (no-op when already one).
    Member {
        room: String,
        agent: String,
    },
    /// The room is cancelled (with what it held) or resumed as of this record's seq.
    Cancel {
        room: String,
        seq: u64,
        cancel: Option<(String, Vec<room_core::event::Held>)>,
    },
    /// An operator resolved a hold.
    Reconciled {
        hold: String,
        seq: u64,
        by: String,
        outcome: String,
        evidence: String,
    },
    /// The room's view is reset as of this record's seq (no-op when already at or past it).
    Reset {
        room: String,
        seq: u64,
        at_ms: u64,
    },
}

/// A commit projects the body it sealed and the text its line holds; a catch-up projects
/// the body and text read back from the record. Both must change the same rows, or the
/// index would depend on how it was built (a body reads back with what serialization
/// leaves out at its default, such as an empty plan's deadline, which no row may use).
#[cfg(debug_assertions)]
fn assert_projected_as_replayed(room: &str, r: &Record, body: &EventBody, text: &str) {
    let fresh = || Projection {
        batch: Batch::default(),
        tasks: Vec::new(),
    };
    let (mut live, mut replayed) = (fresh(), fresh());
    let live_ok = project_into(&mut live, room, r, body, text.to_owned()).is_ok();
    let replayed_ok = project_record(&mut replayed, room, r).is_ok();
    assert_eq!(
        (live_ok, format!("{live:?}")),
        (replayed_ok, format!("{replayed:?}")),
        "a commit projects record {} as a catch-up would",
        r.seq
    );
}

/// Project a record read back from the journal (a replay): its body parsed from the record.
pub(crate) fn project_record(p: &mut Projection, room: &str, r: &Record) -> Result<(), StoreError> {
    let body: EventBody = serde_json::from_value(r.event.clone())
        .map_err(|e| StoreError::Corrupt(format!("record {}: not a room event: {e}", r.seq)))?;
    project_into(p, room, r, &body, canon::canonical_string(&r.event))
}

/// Project a record whose `body` is its event, with `body_text` the event's canonical JSON
/// (a commit has both at hand: the body it sealed, the text its journal line holds).
pub(crate) fn project_into(
    p: &mut Projection,
    room: &str,
    r: &Record,
    body: &EventBody,
    body_text: String,
) -> Result<(), StoreError> {
    p.batch.events.push(EventRow {
        seq: r.seq,
        id: r.id.clone(),
        kind: body.kind().into(),
        actor: body.actor().into(),
        hlc_ms: r.hlc.ms,
        hlc_c: r.hlc.c,
        hash: r.hash.clone(),
        task: body.task().map(String::from),
        body: body_text,
    });
    if let Some(key) = body.idempotency_key() {
        p.batch.idempotency.push((
            body.actor().into(),
            key.into(),
            r.id.clone(),
            r.seq,
            body.task().map(String::from),
        ));
    }
    match &body {
        EventBody::Turn(t) => {
            if let Some(view_gen) = &t.view_gen {
                p.batch.folds.push(FoldAdvance {
                    actor: t.actor.clone(),
                    conversation_key: t.conversation_key.clone(),
                    view_gen: view_gen.clone(),
                    seq: r.seq,
                });
            }
            for parent in t
                .reply_to
                .iter()
                .chain(t.parents.iter())
                .chain(t.evidence.iter())
            {
                if id::is_event_id(parent) {
                    p.batch.edges.push((r.id.clone(), parent.clone()));
                }
            }
            for res in &t.resolves {
                p.batch.resolutions.push((
                    res.item,
                    res.id.clone(),
                    res.status.clone(),
                    r.id.clone(),
                ));
            }
            if let Some(a) = &t.artifact {
                p.batch.artifacts.push(room_store::index::ArtifactRow {
                    kind: a.kind.clone(),
                    key: a.key.clone(),
                    version: a.version,
                    sha256: a.sha256.clone(),
                    bytes: a.bytes,
                    producer: t.actor.clone(),
                    parents: t.parents.clone(),
                    event: r.id.clone(),
                    seq: r.seq,
                    hlc_ms: r.hlc.ms,
                    audience: t.audience.clone(),
                    task: t.task.clone(),
                });
            }
            if let Some(tr) = &t.task_transition {
                p.tasks.push(TaskEffect::Transition(tr.clone(), None));
                // done, blocked, decline and handoff each end the claimer's lifecycle
                p.batch.lifecycles.push(LifecycleChange::Resolve {
                    task: tr.task.clone(),
                });
            }
        }
        EventBody::Items(items) => {
            p.batch.edges.push((r.id.clone(), items.source.clone()));
            let source_seq = r.seq - 1;
            for (kind, list) in [
                (ItemKind::Mention, &items.mentions),
                (ItemKind::Obligation, &items.obligations),
            ] {
                for s in list {
                    p.batch.items.push(ItemRow {
                        kind,
                        id: s.id.clone(),
                        source: items.source.clone(),
                        source_seq,
                        agent: s.agent.clone(),
                        from_agent: s.from.clone(),
                        task: s.task.clone(),
                        status: "open".into(),
                        resolved_by: None,
                        not_after_ms: Some(s.not_after_ms),
                    });
                }
            }
        }
        EventBody::Task(te) => {
            if let Some(c) = &te.created {
                p.tasks.push(TaskEffect::Create(Box::new(TaskRow {
                    id: te.task.clone(),
                    room: room.into(),
                    project_id: c.project.clone(),
                    title: c.title.clone(),
                    owner: c.owner.clone(),
                    recipient: c.recipient.clone(),
                    parent: c.parent.clone(),
                    status: TaskStatus::Open,
                    created_ms: r.hlc.ms,
                    updated_ms: r.hlc.ms,
                    scopes: c.scopes.clone(),
                    requirements: c.requirements.clone(),
                    acceptance: c.acceptance.clone(),
                    coordination_only: c.coordination_only,
                    lease_gen: None,
                    lease_held: false,
                    revision: 0,
                    claim_pin: None,
                    override_reason: None,
                    successor: None,
                    governed: c.governed,
                    // a child journaled before revisions were pinned was delegated at 0
                    parent_revision: c.parent.as_ref().map(|_| c.parent_revision.unwrap_or(0)),
                    stage: c.stage.clone(),
                })));
            }
            if let Some(terms) = &te.terms {
                p.tasks
                    .push(TaskEffect::Terms(te.task.clone(), terms.clone()));
            }
            if let Some(reason) = &te.reason {
                p.tasks
                    .push(TaskEffect::Override(te.task.clone(), reason.clone()));
            }
            if let Some(rec) = te.proposal.as_deref()
                && rec.outcome == "applied"
                && let (Some(from), Some(to)) = (&rec.before_sha256, &rec.after_sha256)
            {
                p.tasks.push(TaskEffect::StagePin {
                    task: te.task.clone(),
                    path: rec.change.path.clone(),
                    from: from.clone(),
                    to: to.clone(),
                });
            }
            for res in &te.resolves {
                p.batch.resolutions.push((
                    res.item,
                    res.id.clone(),
                    res.status.clone(),
                    r.id.clone(),
                ));
            }
            if let Some(tr) = &te.transition {
                p.tasks
                    .push(TaskEffect::Transition(tr.clone(), te.lease_gen));
                if let Some(pin) = &te.authority {
                    p.tasks.push(TaskEffect::Pin(te.task.clone(), pin.clone()));
                }
                if let Some(next) = &te.successor {
                    p.tasks
                        .push(TaskEffect::Successor(te.task.clone(), next.clone()));
                }
                if matches!(tr.to, TaskStatus::Cancelled | TaskStatus::Superseded) {
                    // the holder's claim ends with the task (withdrawn, or replaced by its
                    // successor): it acts on it no more, and is never recorded in doubt after it
                    p.batch.lifecycles.push(LifecycleChange::Resolve {
                        task: te.task.clone(),
                    });
                }
                if tr.to == TaskStatus::Claimed {
                    p.batch.lifecycles.push(LifecycleChange::Begin {
                        agent: te.actor.clone(),
                        task: te.task.clone(),
                        seq: r.seq,
                        at_ms: r.hlc.ms,
                        ttl_ms: te.ttl_ms.unwrap_or(TASKED_DEADLINE_MS),
                    });
                }
            }
        }
        EventBody::Op(o) => match o.phase {
            OpPhase::Begin => p.batch.ops.push(OpChange::Begin(OpRow {
                id: o.op.clone(),
                agent: o.actor.clone(),
                task: o.task.clone(),
                destination: o.destination.clone(),
                parent: o.parent.clone(),
                state: "begun".into(),
                outcome: None,
                probe: o
                    .probe
                    .as_ref()
                    .map(|p| serde_json::to_string(p).expect("probes serialize")),
                began_seq: r.seq,
                began_ms: r.hlc.ms,
                ttl_ms: o.ttl_ms.unwrap_or(crate::ledger::OP_TTL_MS_DEFAULT),
                lapsed: false,
            })),
            OpPhase::Effect => p.batch.ops.push(OpChange::Effect { id: o.op.clone() }),
            OpPhase::Resolve => p.batch.ops.push(OpChange::Resolve {
                id: o.op.clone(),
                outcome: o.outcome.clone().unwrap_or_else(|| "failed".into()),
            }),
        },
        EventBody::Evidence(e) => p.batch.evidence.push(EvidenceRow {
            id: e.evidence.clone(),
            agent: e.actor.clone(),
            task: e.task.clone(),
            req: e.req.clone(),
            origin: e.origin.clone(),
            lineage: e.lineage.clone(),
            event: r.id.clone(),
            seq: r.seq,
            sha256: e.sha256.clone(),
        }),
        EventBody::InvariantViolation(v) if v.act == "op_begin" => {
            if v.invariant == Invariant::Resolution
                && let Some(op) = v.detail["op"].as_str()
            {
                p.batch.ops.push(OpChange::Lapsed { id: op.into() });
            }
        }
        EventBody::InvariantViolation(v) => {
            if v.invariant == Invariant::Resolution
                && let Some(task) = &v.task
            {
                p.batch.lifecycles.push(LifecycleChange::Lapsed {
                    agent: v.actor.clone(),
                    task: task.clone(),
                });
                if let Some(generation) = v.detail["lease_generation"].as_u64() {
                    p.tasks.push(TaskEffect::ReleaseLease {
                        task: task.clone(),
                        generation,
                    });
                }
            }
        }
        EventBody::MemberAdded { agent, .. } => {
            p.tasks.push(TaskEffect::Member {
                room: room.into(),
                agent: agent.clone(),
            });
        }
        EventBody::RoomReset { .. } | EventBody::JournalLoss { .. } => {
            p.tasks.push(TaskEffect::Reset {
                room: room.into(),
                seq: r.seq,
                at_ms: r.hlc.ms,
            });
        }
        EventBody::Admission { open, .. } => {
            p.tasks.push(TaskEffect::Admission {
                room: room.into(),
                seq: r.seq,
                open: *open,
            });
        }
        EventBody::RoomCancelled { actor, held, .. } => {
            let why = format!(
                "room cancelled by {actor} (record {}); retry_allowed: false",
                r.seq
            );
            p.tasks.push(TaskEffect::Cancel {
                room: room.into(),
                seq: r.seq,
                cancel: Some((why, held.clone())),
            });
        }
        EventBody::RoomResumed { .. } => p.tasks.push(TaskEffect::Cancel {
            room: room.into(),
            seq: r.seq,
            cancel: None,
        }),
        EventBody::Reconciled {
            actor,
            hold,
            outcome,
            evidence,
        } => p.tasks.push(TaskEffect::Reconciled {
            hold: hold.clone(),
            seq: r.seq,
            by: actor.clone(),
            outcome: outcome.clone(),
            evidence: evidence.clone(),
        }),
        EventBody::RoomCreated { .. }
        | EventBody::WorkerStop(_)
        | EventBody::Identity(_)
        | EventBody::CollabFlag(_) => {}
    }
    Ok(())
}

impl Engine {
    /// Apply task effects to control.db. Idempotent: creation ignores an existing row, a
    /// transition is a compare-and-set that is a no-op once applied.
    pub(crate) fn apply_task_effects(
        &self,
        effects: &[TaskEffect],
        at_ms: u64,
    ) -> Result<(), StoreError> {
        let mut c = self.control();
        for e in effects {
            match e {
                TaskEffect::Create(t) => {
                    if c.task(&t.id)?.is_none() {
                        c.insert_task(t)?;
                    }
                }
                TaskEffect::Transition(tr, lease_gen) => {
                    c.update_task(
                        &tr.task,
                        tr.from.as_str(),
                        tr.to.as_str(),
                        tr.recipient.as_deref(),
                        at_ms,
                        *lease_gen,
                    )?;
                }
                TaskEffect::ReleaseLease { task, generation } => {
                    c.release_lease(task, *generation)?;
                }
                TaskEffect::Terms(task, terms) => {
                    c.amend_task(task, terms)?;
                }
                TaskEffect::Pin(task, pin) => c.pin_claim(task, pin)?,
                TaskEffect::Override(task, reason) => c.set_override(task, reason)?,
                TaskEffect::Successor(task, next) => c.set_successor(task, next)?,
                TaskEffect::StagePin {
                    task,
                    path,
                    from,
                    to,
                } => {
                    c.move_stage_pin(task, path, from, to)?;
                }
                TaskEffect::Admission { room, seq, open } => {
                    c.set_admission(room, *seq, *open)?;
                }
                TaskEffect::Member { room, agent } => {
                    c.add_member(room, agent)?;
                }
                TaskEffect::Reset { room, seq, at_ms } => {
                    c.reset_room_at(room, *seq, *at_ms)?;
                }
                TaskEffect::Cancel { room, seq, cancel } => {
                    let effect = cancel
                        .as_ref()
                        .map(|(why, held)| room_store::backend::CancelEffect { at_ms, why, held });
                    c.set_cancelled(room, *seq, effect.as_ref())?;
                }
                TaskEffect::Reconciled {
                    hold,
                    seq,
                    by,
                    outcome,
                    evidence,
                } => {
                    c.resolve_hold(
                        hold,
                        &room_store::control::HoldResolution {
                            seq: *seq,
                            at_ms,
                            by,
                            outcome,
                            evidence,
                        },
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl RoomHandle {
    /// Create the shard of a new room whole, with `first` as its first record: a shard a
    /// crashed or failed creation left under the same name (never acknowledged) is set aside.
    pub fn create_shard(engine: &Engine, row: &RoomRow, first: EventBody) -> Outcome<()> {
        let binding = canon::canonical_bytes(&binding_of(row));
        let manifest = room_store::shard::Manifest {
            schema: room_store::shard::SHARD_SCHEMA.into(),
            room: row.name.clone(),
            graph_id: row.graph_id.clone(),
            instance: engine.state.instance_id.clone(),
            created_ms: row.created_ms,
        };
        let manifest = canon::canonical_bytes(&manifest);
        let genesis = ChainTip::genesis(&row.graph_id);
        let hlc = genesis.hlc.tick(engine.now_ms());
        let event = serde_json::to_value(&first).expect("event bodies serialize");
        let record = Sealed::seal(
            &genesis,
            id::event_id(hlc, engine.env.entropy.as_ref()),
            hlc,
            event,
        );
        let store = &engine.rooms.store;
        let create = || {
            store
                .create_shard(
                    &row.graph_id,
                    &binding,
                    &manifest,
                    std::slice::from_ref(&record),
                )
                .map_err(store_err)
        };
        if create()? == ShardCreated::Ready {
            return Ok(());
        }
        let to = store
            .set_aside(&row.graph_id, engine.now_ms())
            .map_err(store_err)?;
        tracing::warn!(room = %row.name, "an unfinished shard of this name is set aside at {to}");
        match create()? {
            ShardCreated::Ready => Ok(()),
            ShardCreated::Exists => Err(Refusal::storage(format!(
                "room {}: a shard appeared while it was created",
                row.name
            ))),
        }
    }

    /// Open a room: reconcile the journal with the index, catch the projection up, and finish
    /// a turn whose second flush was interrupted.
    pub fn open(engine: &Engine, row: &RoomRow) -> Result<RoomHandle, StoreError> {
        let stored: Binding =
            serde_json::from_slice(&engine.rooms.store.read_binding(&row.graph_id)?)
                .map_err(|e| StoreError::Corrupt(format!("{}: binding: {e}", row.name)))?;
        if stored != binding_of(row) {
            return Err(StoreError::Corrupt(format!(
                "{}: the stored binding disagrees with the control store",
                row.name
            )));
        }
        let index = engine.rooms.store.open_index(&row.graph_id)?;
        let blobs = engine.rooms.store.open_blobs(&row.graph_id)?;
        let swept = blobs.sweep_temps()?;
        if swept > 0 {
            tracing::info!(room = %row.name, "removed {swept} blob temp files a crash left");
        }
        let mut h = RoomHandle {
            name: row.name.clone(),
            graph_id: row.graph_id.clone(),
            binding: stored,
            blobs,
            journal: None,
            index,
            read_only: None,
            archived: row.archived_ms.is_some(),
            written: Default::default(),
            rotated: false,
            halted: false,
            moved: false,
            quarantine: None,
            verified: None,
            scrub: Scrub::default(),
            rendered: Default::default(),
            wakes_pending: Vec::new(),
            wakes_mark: 0,
            violations_recent: Default::default(),
            violations_suppressed: Default::default(),
            turnstile: Default::default(),
        };
        let known = h.index.mark()?;
        if !h.open_checked(engine, known.as_ref())? {
            return Ok(h);
        }
        h.recover(engine);
        Ok(h)
    }

    /// Open the journal only once it is checked against what the index last knew: the records
    /// after the last verified position (after an unclean stop, from the first record) up to
    /// the index's mark are read back and verified, the rest as the index catches up, and the
    /// journal must hold every seq a durable witness says was acknowledged. False when the room
    /// is left read-only: rotated, or quarantined.
    fn open_checked(
        &mut self,
        engine: &Engine,
        known: Option<&JournalMark>,
    ) -> Result<bool, StoreError> {
        let trust = self.index.trust()?;
        if let Some(k) = known {
            let from = trust
                .verified
                .as_ref()
                .filter(|v| trust.closed_clean && v.len <= k.len);
            match engine
                .rooms
                .store
                .verify_log_from(&self.graph_id, from, Some(k.len))
            {
                Ok(r) => {
                    if let Some(damage) = r.damage {
                        self.quarantine(damage, None, Vec::new());
                        return Ok(false);
                    }
                    if r.bytes == k.len && r.tip_hash != k.tip_hash {
                        self.quarantine(
                            format!(
                                "the journal's record {} is not the one the index recorded",
                                r.records
                            ),
                            None,
                            Vec::new(),
                        );
                        return Ok(false);
                    }
                    // shorter than the mark: reconciliation below tells loss from rotation
                }
                Err(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        match self.open_journal(engine, known) {
            Ok(()) => {}
            Err(StoreError::Rotated(why)) => return self.rotated_or_lost(engine, why),
            Err(StoreError::Corrupt(why)) => {
                self.quarantine(why, None, Vec::new());
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        let tip = self.tip().seq;
        if let Some(((a, b), witnesses)) = self.missing(engine, tip)? {
            self.quarantine(
                format!("acknowledged records {a}..={b} are missing: the journal ends at {tip}"),
                Some((a, b)),
                witnesses,
            );
            return Ok(false);
        }
        // a crash from here on is an unclean stop: the next open verifies the whole chain
        self.verified = self.journal.as_ref().map(|j| ChainPos::of_mark(j.mark()));
        self.index.set_trust(&LogTrust {
            verified: self.verified.clone(),
            closed_clean: false,
        })?;
        Ok(true)
    }

    /// Reconciliation refused the journal (replaced, rewritten or shorter): read it whole.
    /// Damage or missing acknowledged records quarantine the room; a journal that verifies
    /// and holds every acknowledged seq is a rotation the owner may accept.
    fn rotated_or_lost(&mut self, engine: &Engine, why: String) -> Result<bool, StoreError> {
        let r = match engine
            .rooms
            .store
            .verify_log_from(&self.graph_id, None, None)
        {
            Ok(r) => r,
            Err(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                self.quarantine(format!("{why}; the journal is gone"), None, Vec::new());
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        if let Some(damage) = r.damage {
            self.quarantine(format!("{why}; {damage}"), None, Vec::new());
            return Ok(false);
        }
        if let Some(((a, b), witnesses)) = self.missing(engine, r.records)? {
            self.quarantine(
                format!(
                    "acknowledged records {a}..={b} are missing: the journal ends at {} ({why})",
                    r.records
                ),
                Some((a, b)),
                witnesses,
            );
            return Ok(false);
        }
        tracing::error!(room = %self.name, "journal rotated: {why}");
        self.read_only = Some(why);
        self.rotated = true;
        Ok(false)
    }

    /// The acknowledged seqs past `tip` that a durable witness names and no accepted loss
    /// covers, with every witness read. Witnesses never run ahead of the durable journal
    /// (each is written after an append's fdatasync), so a crash that takes only unsynced
    /// bytes never shows here.
    fn missing(&self, engine: &Engine, tip: u64) -> Result<Option<Missing>, StoreError> {
        let w = self.index.witnesses(tip)?;
        let c = engine.control().room_witnesses(&self.name)?;
        let mut more = Vec::new();
        if c.reset_seq > 0 {
            more.push(SeqWitness {
                source: "room_reset".into(),
                seq: c.reset_seq,
            });
        }
        let mut wake_max = 0;
        for source in &c.wake_sources {
            if let Some(e) = self.index.event_by_id(source)? {
                wake_max = wake_max.max(e.seq);
            }
        }
        if wake_max > 0 {
            more.push(SeqWitness {
                source: "wake_queue".into(),
                seq: wake_max,
            });
        }
        Ok(w.missing_after(tip, &more)
            .map(|m| (m, w.seqs.into_iter().chain(more).collect())))
    }

    /// Stop trusting the journal: read-only, turns refused `room_quarantined`, and the next
    /// open verifies the whole chain again.
    pub(crate) fn quarantine(
        &mut self,
        reason: String,
        missing: Option<(u64, u64)>,
        witnesses: Vec<SeqWitness>,
    ) {
        tracing::error!(room = %self.name, "quarantined: {reason}");
        self.read_only = Some(format!("quarantined: {reason}"));
        if let Err(e) = self.index.set_trust(&LogTrust::default()) {
            tracing::error!(room = %self.name, "forgetting the verified position failed: {e}");
        }
        self.quarantine = Some(Quarantine {
            reason,
            missing,
            witnesses,
        });
    }

    /// `rebuild`, checked first: a journal that does not verify or lacks acknowledged records
    /// is refused `journal_loss_unaccepted` (nothing changes) unless the owner accepts the
    /// loss; then whatever follows the last good record is kept beside the journal and cut,
    /// and the caller records the loss in the journal.
    pub(crate) fn rebuild_checked(
        &mut self,
        engine: &Engine,
        accept_loss: bool,
    ) -> Outcome<Option<Loss>> {
        let r = match engine
            .rooms
            .store
            .verify_log_from(&self.graph_id, None, None)
        {
            Ok(r) => Some(r),
            Err(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(store_err(e)),
        };
        let good = r.as_ref().map_or(0, |r| r.records);
        let damage = r.as_ref().and_then(|r| r.damage.clone());
        // a damaged record costs itself and every record after it
        let damaged_to = good + r.as_ref().map_or(0, |r| r.damaged_records).max(1);
        let missing = self.missing(engine, good).map_err(store_err)?;
        let loss = match (&damage, missing) {
            (None, None) => None,
            (_, m) => {
                let (to, witnesses) = m.map_or((good + 1, Vec::new()), |((_, b), w)| (b, w));
                let to = if damage.is_some() {
                    to.max(damaged_to)
                } else {
                    to
                };
                Some(Loss {
                    from: good + 1,
                    to,
                    witnesses,
                })
            }
        };
        if let Some(l) = &loss
            && !accept_loss
        {
            let damaged = damage
                .as_deref()
                .map_or(String::new(), |d| format!(" ({d})"));
            return Err(Refusal::new(
                Code::JournalLossUnaccepted,
                format!(
                    "room {}: the journal lacks acknowledged records {}..={}{damaged}; a rebuild would write over them",
                    self.name, l.from, l.to
                ),
            )
            .detail(json!({"missing_from": l.from, "missing_to": l.to, "witnesses": l.witnesses, "damage": damage}))
            .hint(format!(
                "restore EVENTS.jsonl from a backup, or accept the loss: `room index rebuild {} --accept-loss`",
                self.name
            )));
        }
        if loss.is_some()
            && let Some(r) = &r
            && (r.damage.is_some() || r.torn_bytes > 0)
        {
            self.journal = None;
            let kept = engine
                .rooms
                .store
                .cut_log(&self.graph_id, r.bytes)
                .map_err(store_err)?;
            tracing::warn!(room = %self.name, "journal cut after seq {good}; the rest is kept in {kept}");
        }
        self.rebuild(engine).map_err(store_err)?;
        Ok(loss)
    }

    /// Drop the projection and refill it from the journal as it now is (receipts and
    /// checkpoints stay). The owner's way to accept a journal that reconciliation refused.
    pub fn rebuild(&mut self, engine: &Engine) -> Result<(), StoreError> {
        // Stay read-only until the rebuild has succeeded: a half-rebuilt room has no journal.
        self.journal = None;
        self.read_only = Some("index rebuild in progress or failed".into());
        self.index.clear_projection()?;
        // control.db's tasks of the room are a projection of the same journal: a rebuild onto
        // a shorter journal must not leave rows (or leases) the journal no longer holds
        engine.control().clear_room_tasks(&self.name)?;
        self.wakes_mark = 0;
        self.open_journal(engine, None)?;
        self.read_only = None;
        self.rotated = false;
        self.quarantine = None;
        self.scrub = Scrub::default();
        self.verified = self.journal.as_ref().map(|j| ChainPos::of_mark(j.mark()));
        self.index.set_trust(&LogTrust {
            verified: self.verified.clone(),
            closed_clean: false,
        })?;
        self.recover(engine);
        Ok(())
    }

    /// Finish what a crash may have cut off: the last turn's flush 2 and flags, then the wake
    /// permits after the wakes mark. A room that cannot must not keep the daemon (and every
    /// other room) from starting: it stays readable and refuses writes.
    fn recover(&mut self, engine: &Engine) {
        if let Err(e) = self.complete_pending(engine) {
            self.halt(format!("completing its last turn failed: {e}"));
        } else if let Err(e) = self.rederive_wakes(engine) {
            self.halt(format!("re-deriving its wake permits failed: {e}"));
        }
    }

    /// Queue every wake permit of the journal from its start, once, after the migration that
    /// created the queue. False when this room could not: it then refuses writes, and the next
    /// start asks again.
    pub(crate) fn requeue_at_start(&mut self, engine: &Engine) -> bool {
        if self.read_only.is_some() {
            return false;
        }
        let requeued = self
            .index
            .set_wakes_mark(0)
            .and_then(|()| self.rederive_wakes(engine));
        match requeued {
            Ok(()) => true,
            Err(e) => {
                self.halt(format!("re-queueing its wake permits failed: {e}"));
                false
            }
        }
    }

    /// Queue every wake permit the journal implies after the wakes mark that is missing (a
    /// crash took it before the queue was written), then move the mark.
    fn rederive_wakes(&mut self, engine: &Engine) -> Result<(), StoreError> {
        let mut mark = self.index.wakes_mark()?;
        self.wakes_mark = mark;
        loop {
            let rows = self.index.items_after(mark, REDERIVE_SLICE)?;
            let Some(last) = rows.last().map(|r| r.seq) else {
                break;
            };
            for row in rows {
                let Ok(EventBody::Items(items)) = serde_json::from_str::<EventBody>(&row.body)
                else {
                    return Err(StoreError::Corrupt(format!(
                        "record {} is not items",
                        row.seq
                    )));
                };
                if items.wakes.is_empty() {
                    continue;
                }
                let source = self
                    .index
                    .event_by_id(&items.source)?
                    .ok_or_else(|| StoreError::Corrupt("items source".into()))?;
                if let Ok(EventBody::Turn(t)) = serde_json::from_str::<EventBody>(&source.body) {
                    engine
                        .queue_wakes(self, &source, &t, &items)
                        .map_err(|r| StoreError::Corrupt(format!("re-deriving wakes: {r}")))?;
                }
            }
            mark = last;
        }
        let (tip, rows) = (self.tip().seq, std::mem::take(&mut self.wakes_pending));
        if !rows.is_empty() {
            engine.control().insert_wakes(&rows)?;
        }
        self.wakes_queued(tip)
    }

    /// The permits sealed since the last call and the tip they cover, when the queue is due a
    /// write: some wait, or the wakes mark lags far enough that a start would re-derive a lot.
    /// The room lock is held, so no turn is between its flushes and its permits.
    pub(crate) fn take_wakes_due(&mut self) -> Option<(u64, Vec<WakeRow>)> {
        let tip = self.tip().seq;
        if self.wakes_pending.is_empty() && tip < self.wakes_mark + WAKES_MARK_LAG_MAX {
            return None;
        }
        Some((tip, std::mem::take(&mut self.wakes_pending)))
    }

    /// Every permit up to `tip` is queued durably: move the wakes mark there.
    pub(crate) fn wakes_queued(&mut self, tip: u64) -> Result<(), StoreError> {
        if tip > self.wakes_mark {
            self.index.set_wakes_mark(tip)?;
            self.wakes_mark = tip;
        }
        Ok(())
    }

    /// Refuse further writes until a restart catches the room up from its journal.
    pub(crate) fn halt(&mut self, why: String) {
        tracing::error!(room = %self.name, "{why}");
        self.read_only = Some(why);
        self.halted = true;
    }

    fn open_journal(
        &mut self,
        engine: &Engine,
        known: Option<&room_store::journal::JournalMark>,
    ) -> Result<(), StoreError> {
        let mut pending = Projection {
            batch: Batch::default(),
            tasks: Vec::new(),
        };
        let mut failed: Option<StoreError> = None;
        let journal = {
            let index = &mut self.index;
            let room = self.name.clone();
            engine
                .rooms
                .store
                .open_log(&self.graph_id, known, &mut |s| {
                    project_record(&mut pending, &room, &s.record)?;
                    if pending.batch.events.len() >= CATCH_UP_SLICE {
                        let p = std::mem::replace(
                            &mut pending,
                            Projection {
                                batch: Batch::default(),
                                tasks: Vec::new(),
                            },
                        );
                        index.apply(&p.batch)?;
                        if let Err(e) = engine.apply_task_effects(&p.tasks, s.record.hlc.ms) {
                            failed = Some(e);
                        }
                    }
                    Ok(())
                })?
        };
        if let Some(e) = failed {
            return Err(e);
        }
        pending.batch.mark = Some(journal.mark().clone());
        self.index.apply(&pending.batch)?;
        engine.apply_task_effects(&pending.tasks, journal.tip().hlc.ms)?;
        self.journal = Some(journal);
        Ok(())
    }

    /// If the last record is a turn whose flags or flush 2 are missing, write them now (its wake
    /// permits follow from `rederive_wakes`). Only the last record can be in that state: a room's writer lock covers both
    /// flushes, so nothing else can be appended between them.
    fn complete_pending(&mut self, engine: &Engine) -> Result<(), StoreError> {
        let tip = match &self.journal {
            Some(j) => j.tip(),
            None => return Ok(()),
        };
        if tip.seq == 0 {
            return Ok(());
        }
        let last = self
            .index
            .event_by_seq(tip.seq)?
            .ok_or_else(|| StoreError::Corrupt("tip not indexed".into()))?;
        let body: EventBody =
            serde_json::from_str(&last.body).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        if let EventBody::Turn(t) = &body
            && !t.flags.is_empty()
        {
            tracing::warn!(room = %self.name, event = %last.id, "writing invariant flags a crash cut off");
            let flags = t.flags.iter().map(|f| {
                let mut f = f.clone();
                f.event = Some(last.id.clone());
                // as `commit_inner` wrote them: withheld wherever their act is
                f.audience = t.audience.clone();
                EventBody::InvariantViolation(f)
            });
            self.commit(engine, flags.collect(), None)
                .map_err(|r| StoreError::Corrupt(format!("completing flags: {r}")))?;
        }
        if let EventBody::Turn(t) = &body
            && !t.plan.is_empty()
        {
            tracing::warn!(room = %self.name, event = %last.id, "completing an interrupted second flush");
            self.flush_items(engine, &last.id, t, None)
                .map_err(|r| StoreError::Corrupt(format!("completing flush 2: {r}")))?;
        }
        Ok(())
    }

    pub fn tip(&self) -> ChainTip {
        self.journal
            .as_ref()
            .map(|j| j.tip())
            .unwrap_or_else(|| ChainTip::genesis(&self.graph_id))
    }

    pub fn writable(&self) -> Outcome<()> {
        self.readable()?;
        if let Some(q) = &self.quarantine {
            return Err(Refusal::new(
                Code::RoomQuarantined,
                format!("room {} is quarantined: {}", self.name, q.reason),
            )
            .detail(json!({"quarantine": q}))
            .hint(format!(
                "run `room verify {0}`, then restore its journal from a backup or accept the loss with `room index rebuild {0} --accept-loss`",
                self.name
            )));
        }
        if self.archived {
            return Err(Refusal::new(
                Code::RoomArchived,
                format!("room {} is archived: it is read-only", self.name),
            )
            .hint("read it with room_sync or `room log`; write in another room"));
        }
        if let Some(why) = &self.read_only {
            if self.rotated {
                return Err(Refusal::new(
                    Code::RoomSyncJournalRotated,
                    format!("room {} is read-only: {why}", self.name),
                )
                .hint(format!(
                    "inspect the journal, then run `room index rebuild {}`",
                    self.name
                )));
            }
            return Err(
                Refusal::storage(format!("room {} is read-only: {why}", self.name))
                    .hint("restart the daemon: it catches the room up from its journal (on a database store the room is opened anew by itself once the database answers)"),
            );
        }
        Ok(())
    }

    /// Reads are refused once the index has lost rows it had acknowledged: a page or a gate
    /// check over it would skip events.
    pub fn readable(&self) -> Outcome<()> {
        if let Some(why) = self.index.broken() {
            return Err(Refusal::storage(format!(
                "room {} index fell behind its journal: {why}",
                self.name
            ))
            .hint("restart the daemon: it catches the index up from the journal"));
        }
        Ok(())
    }

    /// Seal, append (durably) and project `bodies`; returns the records. `fold` is the
    /// checkpoint to store with the projection (the Fold Rule), if any.
    pub(crate) fn commit(
        &mut self,
        engine: &Engine,
        bodies: Vec<EventBody>,
        fold: Option<CheckpointRow>,
    ) -> Outcome<Vec<Record>> {
        self.commit_flagged(engine, bodies, fold, Vec::new())
    }

    /// `commit`, with invariant flags appended in the same batch, each naming the first
    /// record as the event it stands beside: the act and its flags land together or not at all.
    pub(crate) fn commit_flagged(
        &mut self,
        engine: &Engine,
        bodies: Vec<EventBody>,
        fold: Option<CheckpointRow>,
        flags: Vec<crate::event::Violation>,
    ) -> Outcome<Vec<Record>> {
        self.commit_inner(engine, bodies, fold, flags, None)
    }

    /// Commit one record under an id drawn before (the stop outbox names its records in its
    /// files before they are committed, so that a replay commits exactly those).
    pub(crate) fn commit_as(
        &mut self,
        engine: &Engine,
        body: EventBody,
        id: String,
    ) -> Outcome<Record> {
        assert!(id::is_event_id(&id), "a preassigned id is an event id");
        let mut r = self.commit_inner(engine, vec![body], None, Vec::new(), Some(id))?;
        Ok(r.remove(0))
    }

    fn commit_inner(
        &mut self,
        engine: &Engine,
        mut bodies: Vec<EventBody>,
        fold: Option<CheckpointRow>,
        flags: Vec<crate::event::Violation>,
        first_id: Option<String>,
    ) -> Outcome<Vec<Record>> {
        self.writable()?;
        // held from sealing through the append: another writer of this room (another daemon
        // on a shared backend) must not chain onto the same tip
        let _writer = engine
            .rooms
            .store
            .room_writer(&self.graph_id)
            .map_err(store_err)?;
        let Some(journal) = self.journal.as_mut() else {
            return Err(Refusal::storage(format!(
                "room {} has no open journal",
                self.name
            )));
        };
        assert!(!bodies.is_empty(), "a commit writes at least one record");
        let mut tip = journal.tip();
        let mut sealed = Vec::with_capacity(bodies.len() + flags.len());
        let first_hlc = tip.hlc.tick(engine.now_ms());
        let first_id =
            first_id.unwrap_or_else(|| id::event_id(first_hlc, engine.env.entropy.as_ref()));
        let audience = bodies[0].audience().to_vec();
        bodies.extend(flags.into_iter().map(|mut f| {
            f.event = Some(first_id.clone());
            // a flag says what its act was: it is withheld wherever the act is
            f.audience = audience.clone();
            EventBody::InvariantViolation(f)
        }));
        for (n, body) in bodies.iter().enumerate() {
            // The first id is drawn before sealing so that flags can name it.
            let (hlc, rid) = if n == 0 {
                (first_hlc, first_id.clone())
            } else {
                let hlc = tip.hlc.tick(engine.now_ms());
                (hlc, id::event_id(hlc, engine.env.entropy.as_ref()))
            };
            let event = serde_json::to_value(body).expect("event bodies serialize");
            let s = Sealed::seal(&tip, rid, hlc, event);
            tip = ChainTip {
                seq: s.record().seq,
                hash: s.record().hash.clone(),
                hlc,
            };
            sealed.push(s);
        }
        match journal.append(&sealed) {
            Ok(_) => {
                engine
                    .commits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(StoreError::InDoubt(why)) => {
                let id = sealed[0].record().id.clone();
                self.halt(format!("append of {id} is in doubt: {why}"));
                return Err(Refusal::storage(format!("the append of {id} is in doubt ({why}); it may or may not survive"))
                    .detail(json!({"in_doubt": true, "events": sealed.iter().map(|s| &s.record().id).collect::<Vec<_>>()}))
                    .hint("restart the daemon: it reconciles the journal and the room shows what survived"));
            }
            Err(StoreError::Conflict(why)) => {
                // the head moved under this handle: what it holds in memory (tip, projection
                // marks, pending permits) is behind the store, so it is read anew
                self.halt(format!("another writer appended first: {why}"));
                self.moved = true;
                return Err(Refusal::new(
                    Code::RoomSyncConcurrentArrival,
                    format!(
                        "another writer appended to room {} first; nothing was written",
                        self.name
                    ),
                )
                .detail(json!({"room": self.name, "moved_by": "another writer"}))
                .hint("sync the room and try again: the next call reads it anew"));
            }
            Err(e) => {
                return Err(Refusal::storage(format!(
                    "journal append failed, nothing was written: {e}"
                )));
            }
        }
        let mut p = Projection {
            batch: Batch::default(),
            tasks: Vec::new(),
        };
        let mut records = Vec::with_capacity(sealed.len());
        for (s, body) in sealed.into_iter().zip(&bodies) {
            let text = s
                .event_text()
                .map_or_else(|| canon::canonical_string(&s.record().event), String::from);
            let r = s.into_record();
            #[cfg(debug_assertions)]
            assert_projected_as_replayed(&self.name, &r, body, &text);
            project_into(&mut p, &self.name, &r, body, text).map_err(store_err)?;
            records.push(r);
        }
        // The Fold Rule's checkpoint lands on the last record written, never past it.
        if let Some(mut c) = fold {
            c.confirmed_seq = tip.seq;
            c.chunk_seq = None;
            c.chunk_offset = 0;
            // the author's own fold advance (what a replay re-derives from the turn) finds the
            // checkpoint this row writes already at or past it: a statement that changes nothing
            p.batch.folds.retain(|f| {
                !(f.actor == c.actor
                    && f.conversation_key == c.conversation_key
                    && f.view_gen == c.view_gen
                    && f.seq <= c.confirmed_seq)
            });
            p.batch.checkpoints.push(c);
        }
        p.batch.mark = Some(journal.mark().clone());
        let projected = engine
            .apply_task_effects(&p.tasks, tip.hlc.ms)
            .and_then(|()| self.index.apply_deferred(&p.batch));
        if let Err(e) = projected {
            // The journal holds the records; the projection will be caught up at the next open.
            self.halt(format!("projection failed after a durable append: {e}"));
            return Err(Refusal::storage(format!("event {} is durable but its projection failed: {e}", records[0].id))
                .detail(json!({"journal_committed": true, "events": records.iter().map(|r| &r.id).collect::<Vec<_>>()}))
                .hint("restart the daemon to catch the index up"));
        }
        Ok(records)
    }

    /// Flush 2 of a turn: the items its plan implies, then its wake permits.
    pub(crate) fn flush_items(
        &mut self,
        engine: &Engine,
        source_id: &str,
        t: &crate::event::Turn,
        fold: Option<CheckpointRow>,
    ) -> Outcome<Items> {
        let source = self
            .index
            .event_by_id(source_id)
            .map_err(store_err)?
            .expect("flush 1 is projected before flush 2");
        // An item lapses exactly when its wake permit does (created at the turn's seal plus the
        // deadline); a circle keeps the deadline of the obligation it re-raises.
        let not_after_ms = if t.verb == room_core::Verb::Circle {
            t.plan.not_after_ms
        } else {
            source.hlc_ms.saturating_add(t.plan.deadline_ms)
        };
        let spec = |prefix: &str, agent: &String| ItemSpec {
            id: item_id(prefix, source_id, agent),
            agent: agent.clone(),
            from: t.actor.clone(),
            task: t.task.clone(),
            not_after_ms,
        };
        let items = Items {
            actor: t.actor.clone(),
            source: source_id.into(),
            mentions: t
                .plan
                .mention
                .iter()
                .map(|a| spec(crate::event::MENTION_PREFIX, a))
                .collect(),
            obligations: t
                .plan
                .oblige
                .iter()
                .map(|a| spec(crate::event::OBLIGATION_PREFIX, a))
                .collect(),
            wakes: t.plan.wake.clone(),
            audience: t.audience.clone(),
        };
        self.commit(engine, vec![EventBody::Items(items.clone())], fold)?;
        engine.queue_wakes(self, &source, t, &items)?;
        Ok(items)
    }
}

impl RoomHandle {
    /// Verify the next slice (at most `budget` bytes, but at least one record) of this room's
    /// journal from where its scrub stands; the bytes verified. Damage quarantines the room.
    fn scrub_slice(&mut self, engine: &Engine, budget: u64) -> u64 {
        if self.quarantine.is_some() || self.rotated {
            return 0;
        }
        let Some(journal) = &self.journal else {
            return 0;
        };
        let now = engine.now_ms();
        if self
            .scrub
            .done_ms
            .is_some_and(|d| now < d.saturating_add(SCRUB_REPEAT_MS))
        {
            return 0;
        }
        let (end, tip_hash) = (journal.mark().len, journal.tip().hash);
        let start = self.scrub.pos.as_ref().map_or(0, |p| p.len);
        let stop = end.min(start + budget.max(RECORD_BYTES_MAX as u64 + 1));
        let r = match engine.rooms.store.verify_log_from(
            &self.graph_id,
            self.scrub.pos.as_ref(),
            Some(stop),
        ) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(room = %self.name, "scrub read failed (retried later): {e}");
                return 0;
            }
        };
        if let Some(damage) = r.damage {
            self.quarantine(format!("scrub: {damage}"), None, Vec::new());
            return r.bytes.saturating_sub(start);
        }
        if r.bytes >= end {
            if r.tip_hash != tip_hash {
                self.quarantine(
                    format!(
                        "scrub: the journal's record {} is not the one this room appended",
                        r.records
                    ),
                    None,
                    Vec::new(),
                );
                return end - start;
            }
            self.scrub = Scrub {
                pos: None,
                done_ms: Some(now),
            };
            self.verified = Some(r.pos());
            return end - start;
        }
        let done = r.bytes.saturating_sub(start);
        self.scrub.pos = Some(r.pos());
        done
    }
}

impl Engine {
    /// One step of the background scrub: verify at most `budget` bytes of journal (at least
    /// one record), room after room in name order, each from its first record to its tip;
    /// a room's damage quarantines it. A room is scrubbed again `SCRUB_REPEAT_MS` after its
    /// last pass. The bytes verified (0: nothing due). The daemon calls it on a timer.
    pub fn scrub_step(&self, budget: u64) -> u64 {
        let mut left = budget;
        for h in self.room_handles() {
            if left == 0 {
                break;
            }
            let mut room = crate::lock_room(&h);
            left = left.saturating_sub(room.scrub_slice(self, left));
        }
        budget - left
    }

    /// Close every room in order (the daemon's shutdown): flush, then record that each room
    /// was closed cleanly with the position its chain was last verified to, so the next open
    /// verifies only what follows it. A room that is read-only or whose flush fails is not
    /// marked: its next open verifies the whole chain.
    pub fn close_clean(&self) {
        self.flush_indexes();
        // the journals durable in their own files, the commit log empty: what a clean stop
        // leaves needs no replay
        if let Err(e) = self.rooms.store.close_clean() {
            tracing::error!("storage did not close cleanly, the next start replays it: {e}");
        }
        for h in self.room_handles() {
            crate::lock_room(&h).mark_closed_clean();
        }
    }
}

impl RoomHandle {
    /// Record that this room closes cleanly with the position its chain was last verified to,
    /// so the next open verifies only what follows it (its index is flushed). A room that is
    /// read-only is not marked: its next open verifies the whole chain.
    pub(crate) fn mark_closed_clean(&mut self) {
        if self.read_only.is_some() || self.journal.is_none() {
            return;
        }
        let trust = LogTrust {
            verified: self.verified.clone(),
            closed_clean: true,
        };
        if let Err(e) = self.index.set_trust(&trust) {
            tracing::warn!(room = %self.name, "marking a clean close failed: {e}");
        }
    }
}
