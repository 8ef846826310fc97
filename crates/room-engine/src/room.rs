//! One room's shard on disk and its write path. The handle owns the journal (the commit
//! point), the sync index and the blobs. A turn is sealed, appended and fdatasync'ed, then
//! projected; derived state (index rows, task effects, flush 2, wake permits) is caught up
//! from the journal at open, so a crash anywhere after the append loses nothing.

use crate::event::{
    Binding, EventBody, Invariant, ItemSpec, Items, TaskStatus, TaskTransition, item_id,
};
use crate::{Engine, Outcome, store_err};
use room_core::chain::ChainTip;
use room_core::wake::TASKED_DEADLINE_MS;
use room_core::{Code, Record, Refusal, canon, id};
use room_store::control::{RoomRow, TaskRow, WakeRow};
use room_store::index::{Batch, CheckpointRow, EventRow, ItemKind, ItemRow, LifecycleChange};
use room_store::{BlobStore, RoomIndex, RoomLog, ShardCreated, StoreError};
use serde_json::json;
use std::sync::Arc;

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
    /// Recent sync renderings (the room lock guards it).
    pub(crate) rendered: std::cell::RefCell<crate::sync::RenderCache>,
    /// Wake permits sealed since the last time the queue was written (`Engine::flush_wakes`).
    pub(crate) wakes_pending: Vec<WakeRow>,
    /// Every permit of an items record up to this seq is durable.
    wakes_mark: u64,
    /// When this room recorded its recent rejections, and whose (see `invariants::reject`).
    pub(crate) violations_recent: std::collections::VecDeque<(String, u64)>,
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
pub(crate) struct Projection {
    pub batch: Batch,
    pub tasks: Vec<TaskEffect>,
}

/// What a record changes in control.db. Applied at commit and again at catch-up, so each is
/// idempotent: a crash between the journal append and control.db loses nothing.
pub(crate) enum TaskEffect {
    Create(TaskRow),
    Transition(TaskTransition),
    /// A member joins (no-op when already one).
    Member {
        room: String,
        agent: String,
    },
    /// The room's view is reset as of this record's seq (no-op when already at or past it).
    Reset {
        room: String,
        seq: u64,
        at_ms: u64,
    },
}

pub(crate) fn project_into(p: &mut Projection, room: &str, r: &Record) -> Result<(), StoreError> {
    let body: EventBody = serde_json::from_value(r.event.clone())
        .map_err(|e| StoreError::Corrupt(format!("record {}: not a room event: {e}", r.seq)))?;
    p.batch.events.push(EventRow {
        seq: r.seq,
        id: r.id.clone(),
        kind: body.kind().into(),
        actor: body.actor().into(),
        hlc_ms: r.hlc.ms,
        hlc_c: r.hlc.c,
        hash: r.hash.clone(),
        task: body.task().map(String::from),
        body: canon::canonical_string(&r.event),
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
            if let Some(tr) = &t.task_transition {
                p.tasks.push(TaskEffect::Transition(tr.clone()));
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
                p.tasks.push(TaskEffect::Create(TaskRow {
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
                }));
            }
            if let Some(tr) = &te.transition {
                p.tasks.push(TaskEffect::Transition(tr.clone()));
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
        EventBody::InvariantViolation(v) => {
            if v.invariant == Invariant::Resolution
                && let Some(task) = &v.task
            {
                p.batch.lifecycles.push(LifecycleChange::Lapsed {
                    agent: v.actor.clone(),
                    task: task.clone(),
                });
            }
        }
        EventBody::MemberAdded { agent, .. } => {
            p.tasks.push(TaskEffect::Member {
                room: room.into(),
                agent: agent.clone(),
            });
        }
        EventBody::RoomReset { .. } => {
            p.tasks.push(TaskEffect::Reset {
                room: room.into(),
                seq: r.seq,
                at_ms: r.hlc.ms,
            });
        }
        EventBody::RoomCreated { .. } => {}
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
                TaskEffect::Transition(tr) => {
                    c.update_task(
                        &tr.task,
                        tr.from.as_str(),
                        tr.to.as_str(),
                        tr.recipient.as_deref(),
                        at_ms,
                    )?;
                }
                TaskEffect::Member { room, agent } => {
                    c.add_member(room, agent)?;
                }
                TaskEffect::Reset { room, seq, at_ms } => {
                    c.reset_room_at(room, *seq, *at_ms)?;
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
        let record = Record::seal(
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
            rendered: Default::default(),
            wakes_pending: Vec::new(),
            wakes_mark: 0,
            violations_recent: Default::default(),
        };
        let known = h.index.mark()?;
        match h.open_journal(engine, known.as_ref()) {
            Ok(()) => {}
            Err(StoreError::Rotated(why)) => {
                tracing::error!(room = %row.name, "journal rotated: {why}");
                h.read_only = Some(why);
                h.rotated = true;
                return Ok(h);
            }
            Err(e) => return Err(e),
        }
        h.recover(engine);
        Ok(h)
    }

    /// Drop the projection and refill it from the journal as it now is (receipts and
    /// checkpoints stay). The owner's way to accept a journal that reconciliation refused.
    pub fn rebuild(&mut self, engine: &Engine) -> Result<(), StoreError> {
        // Stay read-only until the rebuild has succeeded: a half-rebuilt room has no journal.
        self.journal = None;
        self.read_only = Some("index rebuild in progress or failed".into());
        self.index.clear_projection()?;
        self.wakes_mark = 0;
        self.open_journal(engine, None)?;
        self.read_only = None;
        self.rotated = false;
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
                    project_into(&mut pending, &room, &s.record)?;
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
                    .hint("restart the daemon: it catches the room up from its journal"),
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
        mut bodies: Vec<EventBody>,
        fold: Option<CheckpointRow>,
        flags: Vec<crate::event::Violation>,
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
        let mut records = Vec::with_capacity(bodies.len() + flags.len());
        let first_hlc = tip.hlc.tick(engine.now_ms());
        let first_id = id::event_id(first_hlc, engine.env.entropy.as_ref());
        bodies.extend(flags.into_iter().map(|mut f| {
            f.event = Some(first_id.clone());
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
            let r = Record::seal(&tip, rid, hlc, event);
            tip = ChainTip {
                seq: r.seq,
                hash: r.hash.clone(),
                hlc,
            };
            records.push(r);
        }
        match journal.append(&records) {
            Ok(_) => {}
            Err(StoreError::InDoubt(why)) => {
                let id = records[0].id.clone();
                self.halt(format!("append of {id} is in doubt: {why}"));
                return Err(Refusal::storage(format!("the append of {id} is in doubt ({why}); it may or may not survive"))
                    .detail(json!({"in_doubt": true, "events": records.iter().map(|r| &r.id).collect::<Vec<_>>()}))
                    .hint("restart the daemon: it reconciles the journal and the room shows what survived"));
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
        for r in &records {
            project_into(&mut p, &self.name, r).map_err(store_err)?;
        }
        // The Fold Rule's checkpoint lands on the last record written, never past it.
        p.batch.checkpoints.extend(fold.map(|mut c| {
            c.confirmed_seq = tip.seq;
            c.chunk_seq = None;
            c.chunk_offset = 0;
            c
        }));
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
        let spec = |prefix: &str, agent: &String| ItemSpec {
            id: item_id(prefix, source_id, agent),
            agent: agent.clone(),
            from: t.actor.clone(),
            task: t.task.clone(),
            not_after_ms: t.plan.not_after_ms,
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
        };
        self.commit(engine, vec![EventBody::Items(items.clone())], fold)?;
        let source = self
            .index
            .event_by_id(source_id)
            .map_err(store_err)?
            .expect("flush 1 is projected before flush 2");
        engine.queue_wakes(self, &source, t, &items)?;
        Ok(items)
    }
}
