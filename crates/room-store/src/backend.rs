//! The storage traits the engine reaches the world through, shaped by what it asks: a room's
//! log (the journal: append, tip, verify), a room's index (the projection, sync state and
//! invariant state), its blobs, and the machine-wide control store (principals, grants,
//! rooms, tasks, wakes). A [`Backend`] opens them and hands out a room's writer guard. All SQL
//! lives behind these traits; the embedded SQLite backend is [`SqliteBackend`], and every
//! backend runs the same conformance suite (`crate::conformance`).

use crate::control::{
    AgentRow, ProjectRow, RoomRow, RoomWitnesses, TaskCheckRow, TaskRow, WakeRow,
};
use crate::index::{
    ArtifactRow, Batch, CheckpointRow, EventHead, EventRow, EvidenceRow, IndexWitnesses, ItemKind,
    ItemRow, LifecycleRow, LogTrust, OpRow, ReceiptRow, SqliteConfig,
};
use crate::journal::{ChainPos, Faults, JournalMark, Scanned};
use crate::pipeline::{CommitLog, PipelineConfig};
use crate::shard::Shard;
use crate::statedir::StateDir;
use crate::{Result, StoreError};
use room_core::Sealed;
use room_core::chain::ChainTip;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

/// Tells one state of a store from another without reading it: equal stamps mean nothing was
/// written in between, by this handle (`local`) or by any other writer (`external`). A cache
/// kept beside a store compares stamps to know when to reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangeStamp {
    pub external: u64,
    pub local: u64,
}

/// A room's journal: the commit point of every event.
pub trait RoomLog: Send {
    /// Append sealed records and make them durable; each record's (offset, len). A failure
    /// leaves nothing appended, or poisons the log when even that is unknown
    /// (`StoreError::InDoubt`: the bytes may or may not survive).
    fn append(&mut self, records: &[Sealed]) -> Result<Vec<(u64, u64)>>;
    /// The last durable record's position.
    fn tip(&self) -> ChainTip;
    /// Where the log stands, as the index records it for reconciliation at the next open.
    fn mark(&self) -> &JournalMark;
    /// Why the log refuses appends, when it does (a failed sync).
    fn poisoned(&self) -> Option<&str>;
    /// Bytes known to be durable.
    fn synced_len(&self) -> u64;
    /// Bytes of the log's own file on stable storage; acknowledged bytes past it are durable
    /// elsewhere (a commit log). What a simulated power cut keeps for sure.
    fn file_synced_len(&self) -> u64 {
        self.synced_len()
    }
    /// Bytes in the log now, durable or not (what a simulated crash may still take).
    fn len_now(&self) -> u64;
    /// Where the log lives, for messages and the simulator's crash model.
    fn location(&self) -> PathBuf;
}

/// A room's sync index: the projection of its log, plus the receipts and checkpoints that
/// only it holds.
pub trait RoomIndex: Send {
    fn change_stamp(&self) -> Result<ChangeStamp>;
    /// Every permit of an items record up to this seq is queued durably.
    fn wakes_mark(&self) -> Result<u64>;
    fn set_wakes_mark(&mut self, seq: u64) -> Result<()>;
    /// Items records after `seq`, oldest first, at most `limit`.
    fn items_after(&self, seq: u64, limit: usize) -> Result<Vec<EventRow>>;
    /// The log position the projection covers.
    fn mark(&self) -> Result<Option<JournalMark>>;
    /// How far the log was last verified from its first record, and whether its last holder
    /// closed the room in order (default: nothing known).
    fn trust(&self) -> Result<LogTrust>;
    /// Store the trust durably (with anything pending) before returning.
    fn set_trust(&mut self, t: &LogTrust) -> Result<()>;
    /// The highest acknowledged seq each witness in the index names (its mark, events,
    /// receipts, checkpoints, wakes mark), and the losses accepted by `journal_loss` events at
    /// or below `upto`. Never ahead of the durable log: everything in them followed an append.
    fn witnesses(&self, upto: u64) -> Result<IndexWitnesses>;
    /// Commit pending projection rows.
    fn flush(&mut self) -> Result<()>;
    /// Drop pending projection rows as a crash would (the simulator only).
    fn discard_pending(&mut self);
    /// Why the index refuses reads, when it lost rows it had acknowledged.
    fn broken(&self) -> Option<&str>;
    /// Apply a batch and commit it at once.
    fn apply(&mut self, b: &Batch) -> Result<()>;
    /// Apply a batch into the open transaction (committed by `flush` or a durable write).
    fn apply_deferred(&mut self, b: &Batch) -> Result<()>;
    /// `exactly_once`: the (event id, seq, task) a key was first used for.
    fn idempotent(&self, actor: &str, key: &str) -> Result<Option<(String, u64, Option<String>)>>;
    fn idempotency_keys(&self) -> Result<u64>;
    fn lifecycle(&self, agent: &str, task: &str) -> Result<Option<LifecycleRow>>;
    fn lapsed_begins(&self, now_ms: u64, limit: usize) -> Result<Vec<LifecycleRow>>;
    /// The destination ledger: one operation, a task's operations (oldest first, at most
    /// `limit`), and those unresolved past their TTL and not yet recorded in doubt.
    fn op(&self, id: &str) -> Result<Option<OpRow>>;
    /// Evidence: one handle, and a task requirement's (oldest first, at most `limit`).
    fn evidence(&self, id: &str) -> Result<Option<EvidenceRow>>;
    fn evidence_for(&self, task: &str, req: &str, limit: usize) -> Result<Vec<EvidenceRow>>;
    /// Every evidence of a task (any requirement), oldest first, at most `limit`.
    fn evidence_of_task(&self, task: &str, limit: usize) -> Result<Vec<EvidenceRow>>;
    /// One version of a blackboard artifact (`None`: its newest).
    fn artifact(&self, kind: &str, key: &str, version: Option<u32>) -> Result<Option<ArtifactRow>>;
    /// The newest version of each artifact, in (kind, key) order after `after`.
    fn artifact_heads(&self, after: Option<(&str, &str)>, limit: usize)
    -> Result<Vec<ArtifactRow>>;
    /// The newest version of `kind`/`key` written for `task`.
    fn artifact_of_task(&self, task: &str, kind: &str, key: &str) -> Result<Option<ArtifactRow>>;
    /// Full-text search: the seqs of events whose text matches `query` (FTS5 syntax, which
    /// the caller builds), best first, with their rank (lower is better).
    fn search(&self, query: &str, offset: usize, limit: usize) -> Result<Vec<(u64, f64)>>;
    /// How many artifacts (kind and key) the room holds.
    /// Events after `after` that say something (text, a spilled text's preview, a task's
    /// title) and have no vector for `model` made from their record yet, oldest first:
    /// `(seq, record hash, text)`.
    fn embedding_todo(
        &self,
        model: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String, String)>>;
    /// Keep `model`'s vector of each event, made from the record with that hash (a vector
    /// already kept for the seq is replaced).
    fn put_embeddings(&mut self, model: &str, rows: &[(u64, String, Vec<i8>)]) -> Result<()>;
    /// `model`'s vectors of events before `before`, newest first; only those made from the
    /// record the index holds at their seq.
    fn embeddings(&self, model: &str, before: u64, limit: usize) -> Result<Vec<(u64, Vec<i8>)>>;
    /// How many events have a vector for `model` (of their record), and how many say
    /// something at all.
    fn embedding_counts(&self, model: &str) -> Result<(u64, u64)>;
    fn artifact_keys(&self) -> Result<u64>;
    fn ops_of_task(&self, task: &str, limit: usize) -> Result<Vec<OpRow>>;
    fn lapsed_ops(&self, now_ms: u64, limit: usize) -> Result<Vec<OpRow>>;
    /// Operations not resolved, oldest first, at most `limit`: what a cancel holds.
    fn ops_unresolved(&self, limit: usize) -> Result<Vec<OpRow>>;
    /// Drop the projection (receipts and checkpoints stay) for a rebuild from the log.
    fn clear_projection(&mut self) -> Result<()>;
    fn event_by_seq(&self, seq: u64) -> Result<Option<EventRow>>;
    fn event_by_id(&self, id: &str) -> Result<Option<EventRow>>;
    fn events_from(&self, from: u64, limit: usize) -> Result<Vec<EventRow>>;
    /// As `events_from`, only each event's seq, id, record hash and audience.
    fn event_heads_from(&self, from: u64, limit: usize) -> Result<Vec<EventHead>>;
    /// The first event after `seq` not written by `actor` that holds readers at the gate: one
    /// whose `audience` leaves `actor` out is never owed by it.
    fn first_foreign_after(&self, seq: u64, actor: &str) -> Result<Option<u64>>;
    fn event_count(&self) -> Result<u64>;
    /// A task's lifecycle records (kind `task`) after `after_seq`, oldest first, at most
    /// `limit`.
    fn task_events(&self, task: &str, after_seq: u64, limit: usize) -> Result<Vec<EventRow>>;
    /// Every record naming a task (its lifecycle and the turns that carry it: a `done`, a
    /// `send`) after `after_seq`, oldest first, at most `limit`.
    fn task_records(&self, task: &str, after_seq: u64, limit: usize) -> Result<Vec<EventRow>>;
    /// The events that name `parent` as a causal parent, reply target or evidence, oldest
    /// first, at most `limit`.
    fn citing(&self, parent: &str, limit: usize) -> Result<Vec<EventRow>>;
    /// An actor's checkpoints in this room (one per conversation), furthest first, at most
    /// `limit`.
    fn checkpoints_of(&self, actor: &str, limit: usize) -> Result<Vec<CheckpointRow>>;
    /// The oldest open items of `agent`, at most `limit`, and their total.
    fn open_items_page(&self, agent: &str, limit: usize) -> Result<(Vec<ItemRow>, u64)>;
    fn open_sources(&self, agent: &str, limit: usize) -> Result<Vec<String>>;
    /// The room's open obligations, whoever they are addressed to, oldest first, at most
    /// `limit`.
    fn open_obligations(&self, limit: usize) -> Result<Vec<ItemRow>>;
    fn open_items_for_task(&self, agent: &str, task: &str) -> Result<Vec<ItemRow>>;
    /// Record that `row.agent` (in `row.conversation`) was served bytes `[from, to)` of a
    /// governing-source part; kept newest first, at most `SOURCE_READS_PER_PART_MAX` per
    /// reader, task and part.
    fn put_source_read(&mut self, row: &crate::index::SourceReadRow) -> Result<()>;
    /// The byte ranges a reader was served of one part at digest `sha256`, at or after
    /// `since_ms`, oldest first.
    fn source_reads(
        &self,
        agent: &str,
        conversation: &str,
        task: &str,
        path: &str,
        sha256: &str,
        since_ms: u64,
    ) -> Result<Vec<(u64, u64)>>;
    /// Every agent's open items on a task, oldest first, at most `limit`.
    fn open_items_of_task(&self, task: &str, limit: usize) -> Result<Vec<ItemRow>>;
    fn item(&self, kind: ItemKind, id: &str) -> Result<Option<ItemRow>>;
    fn items(&self, kind: ItemKind) -> Result<Vec<ItemRow>>;
    fn checkpoint(&self, actor: &str, conversation: &str) -> Result<Option<CheckpointRow>>;
    /// Store a checkpoint durably before returning.
    fn put_checkpoint(&mut self, c: &CheckpointRow) -> Result<()>;
    fn put_receipt(&mut self, r: &ReceiptRow) -> Result<()>;
    fn receipt(&self, id: &str) -> Result<Option<ReceiptRow>>;
    /// Mark a receipt confirmed and store its checkpoint, atomically and durably.
    fn confirm(&mut self, receipt_id: &str, now_ms: u64, checkpoint: &CheckpointRow) -> Result<()>;
    /// Audit path: every ancestor of `id`, up to `depth_max` links.
    fn ancestors(&self, id: &str, depth_max: u32) -> Result<Vec<String>>;
}

/// Content-addressed payloads too large for a log line.
pub trait BlobStore: Send + Sync {
    /// Store `bytes` durably; their SHA-256. Idempotent.
    fn put(&self, bytes: &[u8], ext: &str) -> std::io::Result<String>;
    /// Read a blob back, verified against its digest.
    fn get(&self, sha: &str, ext: &str) -> std::io::Result<Vec<u8>>;
    /// Remove what an interrupted `put` left; how many.
    fn sweep_temps(&self) -> std::io::Result<usize>;
}

/// What a cancel record changes beyond the room row: why its permits died, and what it held.
#[derive(Debug, Clone, Copy)]
pub struct CancelEffect<'a> {
    pub at_ms: u64,
    pub why: &'a str,
    pub held: &'a [room_core::event::Held],
}

/// The machine-wide control store. Every write is durable before it returns.
pub trait ControlStore: Send {
    fn change_stamp(&self) -> Result<ChangeStamp>;
    /// Reload any cache an earlier failed write left in doubt (retried on every use).
    fn refresh_if_stale(&mut self);
    /// A cache reload after a failed write failed too: reads must wait for `refresh_if_stale`.
    fn is_stale(&self) -> bool;
    fn control_epoch(&self) -> Result<u64>;
    fn agent(&self, name: &str) -> Result<Option<AgentRow>>;
    fn agent_by_secret(&self, secret_sha256: &str) -> Result<Option<AgentRow>>;
    fn agents(&self) -> Result<Vec<AgentRow>>;
    fn denied_verbs(&self, agent: &str) -> Result<Vec<String>>;
    fn projects(&self) -> Result<Vec<ProjectRow>>;
    fn project(&self, id: &str) -> Result<Option<ProjectRow>>;
    fn rooms(&self) -> Result<Vec<RoomRow>>;
    fn room(&self, name: &str) -> Result<Option<RoomRow>>;
    /// The room's view generation, computed by `digest` once per change of its row or roster,
    /// or of the control epoch (which the engine's views carry).
    fn view_gen(
        &mut self,
        room: &str,
        digest: &dyn Fn(&RoomRow, &[crate::control::MemberStanding<'_>]) -> String,
    ) -> Option<String>;
    fn members(&self, room: &str) -> Result<Vec<String>>;
    fn is_member(&self, room: &str, agent: &str) -> Result<bool>;
    /// The agent and reason of a retired credential digest.
    fn retired_secret(&self, secret_sha256: &str) -> Result<Option<(String, String)>>;
    fn insert_agent(&mut self, a: &AgentRow) -> Result<()>;
    /// Replace an agent's secret; the old digest is retired in the same transaction.
    fn replace_secret(
        &mut self,
        old: &AgentRow,
        new_secret: &str,
        new_registration: &str,
        now_ms: u64,
    ) -> Result<()>;
    fn revoke(&mut self, a: &AgentRow, now_ms: u64) -> Result<()>;
    /// Revoke `root` and every agent delegated below it (at most `depth_max` levels down)
    /// that is not revoked yet, in one transaction, each recording `root` as what revoked it;
    /// the names revoked now.
    fn revoke_subtree(&mut self, root: &str, now_ms: u64, depth_max: u32) -> Result<Vec<String>>;
    fn set_max_tier(&mut self, agent: &str, tier: &str) -> Result<()>;
    /// Replace a delegated agent's scopes (the engine decides whether it may: a plan the
    /// person approved gives a child the scopes its collaboration held back).
    fn set_scopes(&mut self, agent: &str, scopes: &[String]) -> Result<()>;
    fn set_verb_denied(&mut self, agent: &str, verb: &str, denied: bool) -> Result<()>;
    fn insert_project(&mut self, p: &ProjectRow) -> Result<()>;
    fn insert_room(&mut self, r: &RoomRow, members: &[String]) -> Result<()>;
    /// Mark a room archived (read-only from now on); false when it already was or is unknown.
    fn archive_room(&mut self, name: &str, at_ms: u64) -> Result<bool>;
    /// Tasks `owner` created in `room` that are not settled (open, claimed or blocked).
    fn tasks_open_count(&self, room: &str, owner: &str) -> Result<u64>;
    /// Ids of the tasks in `rooms` that start with `prefix`, in id order, at most `limit`
    /// (what a host completes a task argument from).
    fn task_ids_in(&self, rooms: &[String], prefix: &str, limit: usize) -> Result<Vec<String>>;
    /// Rooms that hold a claimed task, in name order (their lifecycles may lapse).
    fn rooms_with_claims(&self) -> Result<Vec<String>>;
    /// Remove a room whose creation failed before it was acknowledged, with its roster; false
    /// when there was none. Refused (an error) once anything else names the room.
    fn remove_room(&mut self, name: &str) -> Result<bool>;
    /// Add a member (false when already one); bumps the room's revision.
    fn add_member(&mut self, room: &str, agent: &str) -> Result<bool>;
    /// Reset the room's view as of the reset record at `seq`; a replay is a no-op.
    fn reset_room_at(&mut self, room: &str, seq: u64, at_ms: u64) -> Result<()>;
    /// Open or close the room's admission as of the admission record at `seq` (its admission
    /// generation); a replay is a no-op.
    fn set_admission(&mut self, room: &str, seq: u64, open: bool) -> Result<()>;
    /// Cancel (with `cancel`) or resume (without) the room as of the record at `seq`, its new
    /// cancel generation. A cancel dead-letters the room's queued permits and keeps the items
    /// it held, in the same transaction. A replay is a no-op.
    fn set_cancelled(
        &mut self,
        room: &str,
        seq: u64,
        cancel: Option<&CancelEffect<'_>>,
    ) -> Result<()>;
    /// How many of the room's permits were dead-lettered with `reason`.
    fn wakes_dead_count(&self, room: &str, reason: &str) -> Result<u64>;
    /// A room's holds, oldest first, at most `limit` (and `control::HOLDS_PAGE_MAX`).
    fn holds(&self, room: &str, limit: usize) -> Result<Vec<crate::control::HoldRow>>;
    fn hold(&self, id: &str) -> Result<Option<crate::control::HoldRow>>;
    /// An owner's composition grant; an id already taken is an error.
    fn insert_composition(&mut self, g: &crate::control::CompositionRow) -> Result<()>;
    fn composition(&self, id: &str) -> Result<Option<crate::control::CompositionRow>>;
    /// Revoke a grant; false when it is unknown or revoked already.
    fn revoke_composition(&mut self, id: &str, now_ms: u64) -> Result<bool>;
    /// Grants held by `agent` (every agent's when `None`), revoked ones too, by id, at most
    /// `limit` (and `control::COMPOSITIONS_PAGE_MAX`).
    fn compositions(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<crate::control::CompositionRow>>;
    /// `agent`'s unrevoked grants, by id, at most `control::COMPOSITIONS_PAGE_MAX` (however
    /// many it holds revoked).
    fn active_compositions(&self, agent: &str) -> Result<Vec<crate::control::CompositionRow>>;
    /// A collaboration's record; an id already taken is an error.
    fn insert_collab(&mut self, c: &crate::control::CollabRow) -> Result<()>;
    fn collab(&self, id: &str) -> Result<Option<crate::control::CollabRow>>;
    /// Collaborations (in `state`, or all), by id.
    fn collabs(&self, state: Option<&str>, limit: usize) -> Result<Vec<crate::control::CollabRow>>;
    /// Move a collaboration from `from` to `to`; false when it was not in `from`.
    fn set_collab_state(&mut self, id: &str, from: &str, to: &str, now_ms: u64) -> Result<bool>;
    /// Record a phase run (a run already recorded is replaced: its state moved on).
    fn put_collab_run(&mut self, r: &crate::control::CollabRunRow) -> Result<()>;
    /// A collaboration's runs, by phase and run.
    fn collab_runs(&self, collab: &str, limit: usize) -> Result<Vec<crate::control::CollabRunRow>>;
    fn insert_approval(&mut self, a: &crate::control::ApprovalRow) -> Result<()>;
    fn approval(&self, id: &str) -> Result<Option<crate::control::ApprovalRow>>;
    /// A collaboration's approval requests, oldest first.
    fn approvals(&self, collab: &str, limit: usize) -> Result<Vec<crate::control::ApprovalRow>>;
    /// Decide a pending request whose digest is `digest`; false when it is not pending or
    /// shows something else now (the caller saw a stale one).
    fn decide_approval(
        &mut self,
        id: &str,
        digest: &str,
        to: &str,
        now_ms: u64,
        note: Option<&str>,
    ) -> Result<bool>;
    /// Resolve a hold; false when it was already resolved (a replay).
    fn resolve_hold(&mut self, id: &str, r: &crate::control::HoldResolution<'_>) -> Result<bool>;
    /// Whether break-glass is engaged: nothing dispatches, no worker runs.
    fn break_glass(&self) -> Result<bool>;
    /// Engage or release break-glass; either advances the control epoch, which is returned.
    fn set_break_glass(&mut self, engaged: bool) -> Result<u64>;
    fn task(&self, id: &str) -> Result<Option<TaskRow>>;
    fn children(&self, parent: &str) -> Result<Vec<TaskRow>>;
    /// Claimed tasks that name a scope, in one project (or, outside projects, one room).
    fn leased(&self, project: Option<&str>, room: &str) -> Result<Vec<TaskRow>>;
    /// The leased tasks (as `leased`) that hold a scope which could conflict with one of
    /// `over`: the same scope, a file directory above one, or a file under one. Looked up by
    /// index, so a claim costs the same against ten leases as against ten thousand.
    fn leased_over(
        &self,
        project: Option<&str>,
        room: &str,
        over: &[room_core::scope::Scope],
    ) -> Result<Vec<TaskRow>>;
    fn insert_task(&mut self, t: &TaskRow) -> Result<()>;
    /// Replace a live task's requirements and checks with `terms` (which make its revision
    /// `terms.revision`), dropping any acceptance override; false when the task is settled
    /// or already at that revision (a replay).
    fn amend_task(&mut self, id: &str, terms: &room_core::event::TaskTerms) -> Result<bool>;
    /// Keep the authority keys a claim pinned.
    fn pin_claim(
        &mut self,
        id: &str,
        pin: &std::collections::BTreeMap<String, String>,
    ) -> Result<()>;
    /// Record an operator's acceptance override.
    fn set_override(&mut self, id: &str, reason: &str) -> Result<()>;
    /// Record the verified successor of a superseded task.
    fn set_successor(&mut self, id: &str, successor: &str) -> Result<()>;
    /// Move the staging pin of task `id`'s selection of `path` from digest `from` to `to`: the
    /// daemon applied a change to that source for the task's holder. False when the pin is not
    /// at `from` (moved already, at a replay; or the source changed some other way first, and
    /// then the stale pin stays the signal it is).
    fn move_stage_pin(&mut self, id: &str, path: &str, from: &str, to: &str) -> Result<bool>;
    /// A project's governing source: the project-relative paths of its parts, in order.
    fn project_source(&self, project: &str) -> Result<Option<Vec<String>>>;
    /// Set (or with `None` clear) a project's governing source.
    fn set_project_source(&mut self, project: &str, parts: Option<&[String]>) -> Result<()>;
    /// The tasks `successor` superseded (at most 64).
    fn superseded_by(&self, successor: &str) -> Result<Vec<TaskRow>>;
    /// Compare-and-set a task's status and recipient; false when it was not in `from_status`.
    /// The task then holds a lease of generation `lease_gen` if one is given (a claim of a
    /// scoped task), and none otherwise: every transition releases the lease it held.
    fn update_task(
        &mut self,
        id: &str,
        from_status: &str,
        status: &str,
        recipient: Option<&str>,
        now_ms: u64,
        lease_gen: Option<u64>,
    ) -> Result<bool>;
    /// Release the task's lease of `generation` (a lapsed claim); false when it holds none of
    /// that generation (already released, or claimed again since).
    fn release_lease(&mut self, id: &str, generation: u64) -> Result<bool>;
    /// The highest lease generation ever issued (0 before the first).
    fn lease_gen_max(&self) -> Result<u64>;
    /// Forget every task of `room` (and their evaluations) so that a rebuild of the room's
    /// projection refills them from its journal exactly; returns how many went.
    fn clear_room_tasks(&mut self, room: &str) -> Result<u64>;
    /// Keep `row` as the task's newest acceptance evaluation (replacing the one before).
    fn record_task_check(&mut self, row: &TaskCheckRow) -> Result<()>;
    fn task_check(&self, task: &str) -> Result<Option<TaskCheckRow>>;
    /// Queued permits, least recently revalidated first, at most `limit`.
    fn wakes_to_check(&self, limit: usize) -> Result<Vec<WakeRow>>;
    /// Record, in one transaction, that queued permits were revalidated at `at_ms`, each with
    /// its verdict: a dead one is dead-lettered, never launched. For each, whether it was still
    /// queued.
    fn wakes_checked(
        &mut self,
        checked: &[crate::control::WakeVerdict],
        at_ms: u64,
    ) -> Result<Vec<bool>>;
    /// One permit by its key, in whatever state.
    fn wake(&self, room: &str, agent: &str, source_event: &str) -> Result<Option<WakeRow>>;
    /// Queued permits of these agents, oldest first, at most `limit` in all.
    fn wakes_queued_of(&self, agents: &[String], limit: usize) -> Result<Vec<WakeRow>>;
    /// Record a launch of a queued permit, which becomes `dispatched`, in one transaction;
    /// false, with nothing written, when the permit is not queued any more (taken by another
    /// launch or dead-lettered meanwhile): two launches of one permit never exist.
    fn insert_launch(&mut self, l: &crate::control::LaunchRow) -> Result<bool>;
    fn launch(&self, id: &str) -> Result<Option<crate::control::LaunchRow>>;
    fn launch_by_secret(&self, secret_sha256: &str) -> Result<Option<crate::control::LaunchRow>>;
    /// An agent's launches, newest first, at most `limit`.
    fn launches_of(&self, agent: &str, limit: usize) -> Result<Vec<crate::control::LaunchRow>>;
    /// A permit's launches, oldest first, at most `control::LAUNCHES_OF_WAKE_MAX`.
    fn launches_of_wake(
        &self,
        room: &str,
        agent: &str,
        source_event: &str,
    ) -> Result<Vec<crate::control::LaunchRow>>;
    /// Launches not ended (at a start: those a crash left behind).
    fn launches_live(&self) -> Result<Vec<crate::control::LaunchRow>>;
    /// A starting launch's process was claimed with `pid`; false when it was not starting.
    fn launch_running(&mut self, id: &str, pid: Option<u32>, at_ms: u64) -> Result<bool>;
    /// Record that a broker response of the launch was cut off mid-write by a revocation
    /// (`detail`, JSON); the first is kept: false when one was already recorded.
    fn launch_severed(&mut self, id: &str, detail: &str) -> Result<bool>;
    /// A launch whose job was not seen empty when stopped: its credential stops working, it
    /// still counts as live (busy, capacity) until a stop sees it empty; false when it was not
    /// starting or running.
    fn launch_unconfirmed(&mut self, id: &str, detail: &str) -> Result<bool>;
    /// End a launch with its outcome and move its permit to `wake_state`; false when it had
    /// already ended.
    fn launch_ended(&mut self, id: &str, end: &crate::control::LaunchEnd) -> Result<bool>;
    /// Sessions, newest first, of one agent or all, at most `limit` (and `SESSIONS_PAGE_MAX`).
    fn sessions(
        &self,
        agent: Option<&str>,
        limit: usize,
    ) -> Result<Vec<crate::control::SessionRow>>;
    fn session(&self, id: &str) -> Result<Option<crate::control::SessionRow>>;
    /// The session an agent's launches deliver into, if one is bound.
    fn session_bound(&self, agent: &str) -> Result<Option<crate::control::SessionRow>>;
    /// Queue permits in one transaction; a permit already queued stays as sealed.
    fn insert_wakes(&mut self, rows: &[WakeRow]) -> Result<()>;
    fn wakes_requeue_pending(&self) -> Result<bool>;
    fn wakes_requeue_done(&mut self) -> Result<()>;
    /// What control.db witnesses of a room's acknowledged records (its last reset's seq, the
    /// sources of its newest queued wake permits).
    fn room_witnesses(&self, room: &str) -> Result<RoomWitnesses>;
    /// Queued permits, oldest first, optionally of one room; at most `WAKES_PAGE_MAX`.
    fn wakes(&self, room: Option<&str>) -> Result<Vec<WakeRow>>;
}

/// What creating a shard found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardCreated {
    /// The shard is new, whole: binding, manifest and a log holding the first records.
    Ready,
    /// A shard of that graph id is already there; nothing was written.
    Exists,
}

/// Opens a room's log with a callback fed every record after `known` (all of them when it is
/// `None`), so the caller can catch its projection up in the same pass.
pub type ScanEach<'a> = &'a mut dyn FnMut(Scanned) -> Result<()>;

/// A storage backend: opens the control store and each room's parts, and serializes a room's
/// writers.
pub trait Backend: Send + Sync {
    fn open_control(&self) -> Result<Box<dyn ControlStore>>;
    /// Create a room's shard whole or not at all, across a crash at any point: its binding,
    /// manifest and a log holding `first` (sealed from the genesis tip). Never touches an
    /// existing shard (`Exists`).
    fn create_shard(
        &self,
        graph_id: &str,
        binding: &[u8],
        manifest: &[u8],
        first: &[Sealed],
    ) -> Result<ShardCreated>;
    /// Move a shard no room owns out of the way (kept aside, never read as a room): what a
    /// failed or interrupted creation left. Returns where it went.
    fn set_aside(&self, graph_id: &str, now_ms: u64) -> Result<String>;
    /// Set aside everything in the room space that is not the shard of one of `known` (the
    /// rooms the control store holds); what was set aside.
    fn sweep_strays(
        &self,
        known: &std::collections::BTreeSet<String>,
        now_ms: u64,
    ) -> Result<Vec<String>>;
    /// The stored binding of a room.
    fn read_binding(&self, graph_id: &str) -> Result<Vec<u8>>;
    fn open_index(&self, graph_id: &str) -> Result<Box<dyn RoomIndex>>;
    fn open_log(
        &self,
        graph_id: &str,
        known: Option<&JournalMark>,
        each: ScanEach<'_>,
    ) -> Result<Box<dyn RoomLog>>;
    fn open_blobs(&self, graph_id: &str) -> Result<Arc<dyn BlobStore>>;
    /// Check a room's whole chain from its first record without changing anything.
    fn verify_log(&self, graph_id: &str) -> Result<crate::journal::VerifyReport>;
    /// Check the records after `from` (the first record when `None`) that end before `stop`
    /// (the log's end when `None`) without changing anything: a slice of a scrub, or the
    /// stretch between a verified position and the index's mark.
    fn verify_log_from(
        &self,
        graph_id: &str,
        from: Option<&ChainPos>,
        stop: Option<u64>,
    ) -> Result<crate::journal::VerifyReport>;
    /// Cut a room's log back to `len` (a record boundary the caller verified), keeping what
    /// was cut beside it; where it was kept. Only while the room's log is closed.
    fn cut_log(&self, graph_id: &str, len: u64) -> Result<String>;
    /// The right to append to a room until the guard drops. Blocks while another holds it.
    fn room_writer(&self, graph_id: &str) -> Result<WriterGuard>;
    /// Make every log durable in its own place before a clean stop (the SQLite backend's
    /// commit log is checkpointed and emptied).
    fn close_clean(&self) -> Result<()> {
        Ok(())
    }
    /// The commit pipeline's counters (batches synced, appends in them), where there is one.
    fn commit_stats(&self) -> Option<crate::pipeline::PipelineStats> {
        None
    }
    /// Whether a room halted by a failed write (a lost connection, an append in doubt, an
    /// index batch not committed) is caught up by closing it and opening it again, as a
    /// restart would: true where the store alone holds what committed and reads it back at
    /// the open (a database). The embedded store says no: its commit log is replayed only at
    /// a start, so a halted room there waits for the restart.
    fn reopen_heals_halts(&self) -> bool {
        false
    }
    /// Why this process may never write to the store again (another daemon took a shared
    /// database over), if it may not; the daemon stops then.
    fn fenced(&self) -> Option<String> {
        None
    }
    /// Files besides the rooms' logs whose unsynced bytes a power cut may take, as (path,
    /// synced, written): the simulator's crash model.
    fn unsynced_files(&self) -> Vec<(PathBuf, u64, u64)> {
        Vec::new()
    }
}

/// Held while a room is written. SQLite: one daemon owns the state dir (its lock file), so
/// the guard is in-process; a shared database would hold a row lock on the room's head.
pub struct WriterGuard {
    _held: Box<dyn Send>,
}

impl WriterGuard {
    pub fn new(held: Box<dyn Send>) -> WriterGuard {
        WriterGuard { _held: held }
    }
}

/// Each room's in-process writer lock, made on first use: what one daemon's writers of a room
/// wait on (a database shared by several daemons serializes them further itself).
#[derive(Default)]
pub struct RoomWriters(Mutex<HashMap<String, Arc<InProcessLock>>>);

impl RoomWriters {
    /// The right to write `graph_id` until the guard drops; blocks while another holds it.
    pub fn acquire(&self, graph_id: &str) -> Result<WriterGuard> {
        let lock = self
            .0
            .lock()
            .map_err(|_| StoreError::Corrupt("writer map lock poisoned".into()))?
            .entry(graph_id.to_string())
            .or_default()
            .clone();
        Ok(WriterGuard::new(Box::new(lock.acquire())))
    }
}

/// A lock whose guard owns a reference to it, so a guard can outlive the map it came from.
#[derive(Default)]
struct InProcessLock {
    held: Mutex<bool>,
    freed: Condvar,
}

struct InProcessHeld(Arc<InProcessLock>);

impl InProcessLock {
    fn acquire(self: &Arc<Self>) -> InProcessHeld {
        let mut held = self.held.lock().expect("writer lock is never poisoned");
        while *held {
            held = self
                .freed
                .wait(held)
                .expect("writer lock is never poisoned");
        }
        *held = true;
        InProcessHeld(self.clone())
    }
}

impl Drop for InProcessHeld {
    fn drop(&mut self) {
        *self.0.held.lock().expect("writer lock is never poisoned") = false;
        self.0.freed.notify_one();
    }
}

/// How a journal append becomes durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JournalSync {
    /// Through the daemon-wide commit log: appends of all rooms that arrive together share
    /// one fdatasync (`pipeline`).
    #[default]
    Pipeline,
    /// Each append syncs its own journal (what the benchmarks compare the pipeline with).
    PerAppend,
}

/// How the SQLite backend opens its files.
#[derive(Debug, Clone, Default)]
pub struct SqliteBackendConfig {
    pub sqlite: SqliteConfig,
    /// Injected journal and blob faults (the simulator only).
    pub faults: Option<Arc<dyn Faults>>,
    pub journal_sync: JournalSync,
    pub pipeline: PipelineConfig,
}

/// The embedded default: control.db and, per room, a journal file, a SQLite sync index and a
/// blob directory under the state dir.
pub struct SqliteBackend {
    control_db: PathBuf,
    rooms: PathBuf,
    /// Where shards no room owns are kept aside.
    debris: PathBuf,
    /// The commit log's directory.
    commit: PathBuf,
    config: SqliteBackendConfig,
    writers: RoomWriters,
    /// Opened (and replayed) before the first journal is.
    pipeline: Mutex<Option<Arc<CommitLog>>>,
}

impl SqliteBackend {
    pub fn new(state: &StateDir, config: SqliteBackendConfig) -> SqliteBackend {
        SqliteBackend {
            control_db: state.control_db(),
            rooms: state.rooms(),
            debris: state.debris(),
            commit: state.commit_log(),
            config,
            writers: RoomWriters::default(),
            pipeline: Mutex::new(None),
        }
    }

    /// The commit log, opened at the first call: whatever a crash left in it is replayed into
    /// the journals before any of them is opened or read. `None` without a pipeline.
    fn pipeline(&self) -> Result<Option<Arc<CommitLog>>> {
        if self.config.journal_sync != JournalSync::Pipeline {
            return Ok(None);
        }
        let mut p = self
            .pipeline
            .lock()
            .map_err(|_| StoreError::Corrupt("commit log slot poisoned".into()))?;
        if let Some(log) = &*p {
            return Ok(Some(log.clone()));
        }
        let (log, _replayed) = CommitLog::open(
            &self.commit,
            &self.rooms,
            self.config.pipeline.clone(),
            self.config.faults.clone(),
        )?;
        let log = Arc::new(log);
        *p = Some(log.clone());
        Ok(Some(log))
    }

    /// Sync every journal and empty the commit log of earlier entries: before a journal is
    /// cut or moved, so that no replay writes back into it.
    fn checkpoint(&self) -> Result<()> {
        match self.pipeline()? {
            Some(log) => log.checkpoint_now(),
            None => Ok(()),
        }
    }

    fn shard(&self, graph_id: &str) -> Shard {
        Shard::at(&self.rooms, graph_id)
    }
}

impl Backend for SqliteBackend {
    fn open_control(&self) -> Result<Box<dyn ControlStore>> {
        Ok(Box::new(crate::control::SqliteControl::open(
            &self.control_db,
            &self.config.sqlite,
        )?))
    }

    fn create_shard(
        &self,
        graph_id: &str,
        binding: &[u8],
        manifest: &[u8],
        first: &[Sealed],
    ) -> Result<ShardCreated> {
        self.shard(graph_id).create(
            graph_id,
            binding,
            manifest,
            first,
            self.config.faults.clone(),
        )
    }

    fn set_aside(&self, graph_id: &str, now_ms: u64) -> Result<String> {
        self.checkpoint()?;
        let to = self.shard(graph_id).set_aside(&self.debris, now_ms)?;
        Ok(to.display().to_string())
    }

    fn sweep_strays(
        &self,
        known: &std::collections::BTreeSet<String>,
        now_ms: u64,
    ) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let strays = crate::shard::strays(&self.rooms, known)?;
        if !strays.is_empty() {
            self.checkpoint()?;
        }
        for stray in strays {
            let to = stray.set_aside(&self.debris, now_ms)?;
            out.push(to.display().to_string());
        }
        Ok(out)
    }

    fn read_binding(&self, graph_id: &str) -> Result<Vec<u8>> {
        Ok(std::fs::read(self.shard(graph_id).binding())?)
    }

    fn open_index(&self, graph_id: &str) -> Result<Box<dyn RoomIndex>> {
        Ok(Box::new(crate::index::Index::open_with(
            &self.shard(graph_id).index(),
            &self.config.sqlite,
        )?))
    }

    fn open_log(
        &self,
        graph_id: &str,
        known: Option<&JournalMark>,
        each: ScanEach<'_>,
    ) -> Result<Box<dyn RoomLog>> {
        let pipeline = self.pipeline()?;
        let shard = self.shard(graph_id);
        let journal = crate::journal::Journal::open(
            &shard.journal(),
            graph_id,
            known,
            &shard.errors(),
            each,
        )?
        .with_faults(self.config.faults.clone());
        Ok(Box::new(match pipeline {
            Some(log) => journal.with_pipeline(&log)?,
            None => journal,
        }))
    }

    fn open_blobs(&self, graph_id: &str) -> Result<Arc<dyn BlobStore>> {
        Ok(Arc::new(
            crate::blobs::Blobs::new(self.shard(graph_id).blobs())
                .with_faults(self.config.faults.clone()),
        ))
    }

    fn verify_log(&self, graph_id: &str) -> Result<crate::journal::VerifyReport> {
        self.pipeline()?;
        crate::journal::verify(&self.shard(graph_id).journal(), graph_id)
    }

    fn verify_log_from(
        &self,
        graph_id: &str,
        from: Option<&ChainPos>,
        stop: Option<u64>,
    ) -> Result<crate::journal::VerifyReport> {
        self.pipeline()?;
        crate::journal::verify_range(&self.shard(graph_id).journal(), graph_id, from, stop)
    }

    fn cut_log(&self, graph_id: &str, len: u64) -> Result<String> {
        self.checkpoint()?;
        let shard = self.shard(graph_id);
        let kept = crate::journal::cut_at(&shard.journal(), len, &shard.errors())?;
        Ok(kept.display().to_string())
    }

    fn room_writer(&self, graph_id: &str) -> Result<WriterGuard> {
        self.writers.acquire(graph_id)
    }

    fn close_clean(&self) -> Result<()> {
        let p = self.pipeline.lock().map(|p| p.clone()).ok().flatten();
        p.map_or(Ok(()), |log| log.checkpoint_now())
    }

    fn commit_stats(&self) -> Option<crate::pipeline::PipelineStats> {
        let p = self.pipeline.lock().map(|p| p.clone()).ok().flatten();
        p.map(|log| log.stats())
    }

    fn unsynced_files(&self) -> Vec<(PathBuf, u64, u64)> {
        let p = self.pipeline.lock().map(|p| p.clone()).ok().flatten();
        p.map(|log| log.unsynced()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{CASES, Harness};

    /// A fresh state dir per case; reopening drops nothing but the backend value.
    struct Sqlite {
        dir: Option<tempfile::TempDir>,
        state: Option<StateDir>,
        journal_sync: JournalSync,
    }

    impl Harness for Sqlite {
        fn fresh(&mut self) -> Arc<dyn Backend> {
            let dir = tempfile::tempdir().expect("temp dir");
            let root = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
            let state = crate::statedir::init(&root.join("state"), &root.join("boot.toml"), "c")
                .expect("state dir");
            self.dir = Some(dir);
            self.state = Some(state);
            self.reopen()
        }

        fn reopen(&mut self) -> Arc<dyn Backend> {
            let state = self.state.as_ref().expect("fresh before reopen");
            let config = SqliteBackendConfig {
                journal_sync: self.journal_sync,
                ..SqliteBackendConfig::default()
            };
            Arc::new(SqliteBackend::new(state, config))
        }
    }

    #[test]
    fn the_sqlite_backend_conforms_with_the_commit_pipeline() {
        for (name, case) in CASES {
            eprintln!("conformance: {name}");
            case(&mut Sqlite {
                dir: None,
                state: None,
                journal_sync: JournalSync::Pipeline,
            });
        }
    }

    #[test]
    fn the_sqlite_backend_conforms_with_a_sync_per_append() {
        for (name, case) in CASES {
            eprintln!("conformance: {name}");
            case(&mut Sqlite {
                dir: None,
                state: None,
                journal_sync: JournalSync::PerAppend,
            });
        }
    }
}
