//! `control.db`: the machine-wide tables that are not per-room projections: principals and their
//! credential digests, verb policy, project grants, rooms and rosters, tasks, the wake queue and
//! the control epoch. Every change here is committed (synchronous=FULL) before the call that made
//! it returns; wake permits, derived from the journal, are committed in batches by the flush.

use crate::backend::{ChangeStamp, ControlStore};
use crate::index::SqliteConfig;
use crate::{Result, StoreError};
use room_core::TaskStatus;
use rusqlite::{Connection, OptionalExtension, params};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
INSERT INTO meta (key, value) VALUES ('control_epoch', '1');
CREATE TABLE agents (
    name TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL UNIQUE,
    registration_sha256 TEXT NOT NULL,
    generation INTEGER NOT NULL,
    max_tier TEXT NOT NULL,
    host_kind TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    revoked_ms INTEGER
) STRICT;
CREATE TABLE retired_secrets (
    secret_sha256 TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    retired_ms INTEGER NOT NULL,
    why TEXT NOT NULL
) STRICT;
CREATE TABLE denied_verbs (
    agent TEXT NOT NULL REFERENCES agents(name),
    verb TEXT NOT NULL,
    PRIMARY KEY (agent, verb)
) STRICT;
CREATE TABLE projects (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    requested_root TEXT NOT NULL,
    canonical_root TEXT NOT NULL UNIQUE,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    mnt_id INTEGER NOT NULL,
    opened_ms INTEGER NOT NULL
) STRICT;
CREATE TABLE rooms (
    name TEXT PRIMARY KEY,
    graph_id TEXT NOT NULL UNIQUE,
    project_id TEXT REFERENCES projects(id),
    created_ms INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    reset_gen INTEGER NOT NULL,
    reset_ms INTEGER,
    admission_gen INTEGER NOT NULL
) STRICT;
CREATE TABLE members (
    room TEXT NOT NULL REFERENCES rooms(name),
    agent TEXT NOT NULL REFERENCES agents(name),
    PRIMARY KEY (room, agent)
) STRICT;
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    room TEXT NOT NULL REFERENCES rooms(name),
    project_id TEXT,
    title TEXT NOT NULL,
    owner TEXT NOT NULL,
    recipient TEXT,
    parent TEXT REFERENCES tasks(id),
    status TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
) STRICT;
"#,
    r#"
ALTER TABLE tasks ADD COLUMN scopes TEXT NOT NULL DEFAULT '[]';
CREATE INDEX tasks_parent ON tasks(parent) WHERE parent IS NOT NULL;
CREATE INDEX tasks_claimed ON tasks(status) WHERE status = 'claimed';
"#,
    r#"
CREATE TABLE wakes (
    room TEXT NOT NULL REFERENCES rooms(name),
    agent TEXT NOT NULL,
    source_event TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    permit TEXT NOT NULL,
    PRIMARY KEY (room, agent, source_event)
) STRICT;
CREATE INDEX wakes_created ON wakes(created_ms);
CREATE INDEX wakes_room_created ON wakes(room, created_ms);
-- permits sealed before this table existed were files: every room queues its permits anew
INSERT INTO meta (key, value) VALUES ('wakes_requeue', '1');
"#,
    r#"
ALTER TABLE rooms ADD COLUMN archived_ms INTEGER;
"#,
    r#"
ALTER TABLE tasks ADD COLUMN requirements TEXT NOT NULL DEFAULT '[]';
ALTER TABLE tasks ADD COLUMN acceptance TEXT NOT NULL DEFAULT '[]';
CREATE TABLE task_checks (
    task TEXT PRIMARY KEY REFERENCES tasks(id),
    at_ms INTEGER NOT NULL,
    pass INTEGER NOT NULL,
    evaluation TEXT NOT NULL
) STRICT;
"#,
    r#"
ALTER TABLE tasks ADD COLUMN coordination_only INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN lease_gen INTEGER;
ALTER TABLE tasks ADD COLUMN lease_held INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET lease_held = 1, lease_gen = 0 WHERE status = 'claimed' AND scopes != '[]';
DROP INDEX tasks_claimed;
CREATE INDEX tasks_leased ON tasks(project_id, room) WHERE lease_held = 1;
"#,
    r#"
ALTER TABLE tasks ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN claim_pin TEXT;
ALTER TABLE tasks ADD COLUMN override_reason TEXT;
ALTER TABLE tasks ADD COLUMN successor TEXT;
CREATE INDEX tasks_successor ON tasks(successor) WHERE successor IS NOT NULL;
-- each scope of each task, so that a claim looks up only the leases that could conflict
CREATE TABLE task_scopes (
    task TEXT NOT NULL REFERENCES tasks(id),
    namespace TEXT NOT NULL,
    resource TEXT NOT NULL,
    PRIMARY KEY (task, namespace, resource)
) STRICT;
CREATE INDEX task_scopes_resource ON task_scopes(namespace, resource);
INSERT OR IGNORE INTO task_scopes (task, namespace, resource)
    SELECT t.id, substr(j.value, 1, instr(j.value, ':') - 1), substr(j.value, instr(j.value, ':') + 1)
    FROM tasks t, json_each(t.scopes) j;
"#,
    r#"
ALTER TABLE rooms ADD COLUMN admission_open INTEGER NOT NULL DEFAULT 1;
"#,
    r#"
CREATE TABLE project_sources (
    project TEXT PRIMARY KEY REFERENCES projects(id),
    parts TEXT NOT NULL
) STRICT;
ALTER TABLE tasks ADD COLUMN governed INTEGER NOT NULL DEFAULT 0;
"#,
    r#"
ALTER TABLE tasks ADD COLUMN parent_revision INTEGER;
UPDATE tasks SET parent_revision = 0 WHERE parent IS NOT NULL;
"#,
    // the newest lease generation is read at every scoped claim: by index, not by a scan
    r#"
CREATE INDEX tasks_lease_gen ON tasks(lease_gen) WHERE lease_gen IS NOT NULL;
"#,
    // dispatch: each permit's state (queued, or dead with the code that refused it) and when
    // it was last revalidated, so that every queued permit gets its turn
    r#"
ALTER TABLE wakes ADD COLUMN state TEXT NOT NULL DEFAULT 'queued';
ALTER TABLE wakes ADD COLUMN reason TEXT;
ALTER TABLE wakes ADD COLUMN detail TEXT;
ALTER TABLE wakes ADD COLUMN checked_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX wakes_state_checked ON wakes(state, checked_ms);
CREATE INDEX wakes_agent_state ON wakes(agent, state, created_ms);
"#,
    // launches: one per attempt to deliver a permit to a worker process, with the digest of
    // its one-launch credential; the worker's calls are authorized through it while it runs
    r#"
CREATE TABLE launches (
    id TEXT PRIMARY KEY,
    room TEXT NOT NULL,
    agent TEXT NOT NULL,
    source_event TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL UNIQUE,
    permit_sha256 TEXT NOT NULL,
    state TEXT NOT NULL,
    pid INTEGER,
    created_ms INTEGER NOT NULL,
    not_after_ms INTEGER NOT NULL,
    ended_ms INTEGER,
    outcome TEXT
) STRICT;
CREATE INDEX launches_agent ON launches(agent, state);
CREATE INDEX launches_wake ON launches(room, agent, source_event);
"#,
    // what a launch proved about delivery (the rung of the proof ladder it reached) and what
    // its adapter reported (an ACP session's id and stop reason, a cancel)
    r#"
ALTER TABLE launches ADD COLUMN proof TEXT;
ALTER TABLE launches ADD COLUMN detail TEXT;
-- the wake_delivery receipt of the evidence served to (and withheld from) its recipient
ALTER TABLE launches ADD COLUMN delivery TEXT;
-- when the split-lock claim made it running
ALTER TABLE launches ADD COLUMN started_ms INTEGER;
-- the dispatcher counts the live launches on every pass: by index, however many have ended
CREATE INDEX launches_live ON launches(created_ms) WHERE state != 'ended';
"#,
    // the session factory: each native session an adapter opened or loaded, under its global
    // id; at most one bound per agent (the one spawn_policy "never" delivers into)
    r#"
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    host TEXT NOT NULL,
    native TEXT NOT NULL,
    cwd TEXT NOT NULL,
    transport TEXT NOT NULL,
    model TEXT,
    proof TEXT NOT NULL,
    parent TEXT,
    launch TEXT NOT NULL,
    launches INTEGER NOT NULL,
    loadable INTEGER NOT NULL,
    bound INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX sessions_agent ON sessions(agent, updated_ms);
CREATE UNIQUE INDEX sessions_bound ON sessions(agent) WHERE bound = 1;
"#,
    // active cancellation: a room's cancel generation (the seq of its newest cancel or resume
    // record) and whether it is cancelled; the control epoch and cancel generation each launch
    // started under (the observer stops a launch whose authority moved past them); the items
    // a cancel held for reconciliation; break-glass
    r#"
ALTER TABLE rooms ADD COLUMN cancel_gen INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rooms ADD COLUMN cancelled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE launches ADD COLUMN control_epoch INTEGER NOT NULL DEFAULT 1;
ALTER TABLE launches ADD COLUMN cancel_gen INTEGER NOT NULL DEFAULT 0;
CREATE TABLE holds (
    id TEXT PRIMARY KEY,
    room TEXT NOT NULL REFERENCES rooms(name),
    kind TEXT NOT NULL,
    item TEXT NOT NULL,
    agent TEXT,
    task TEXT,
    cancel_seq INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    resolved_seq INTEGER,
    resolved_ms INTEGER,
    resolved_by TEXT,
    outcome TEXT,
    evidence TEXT
) STRICT;
CREATE INDEX holds_room ON holds(room, created_ms);
INSERT INTO meta (key, value) VALUES ('break_glass', '0');
"#,
    // worker staging: the sources a task's workers are staged with
    r#"
ALTER TABLE tasks ADD COLUMN stage TEXT NOT NULL DEFAULT '[]';
"#,
    // a session launch: a permit its agent took in its own MCP session, correlated by that
    // session's conversation (a worker launch has none: its conversation is `wake:<launch>`)
    r#"
ALTER TABLE launches ADD COLUMN conversation TEXT;
-- a broker response cut off by a revocation while it was partly written: what was recorded
ALTER TABLE launches ADD COLUMN severed TEXT;
-- a session's tags, as its route gave them at its newest launch (a JSON list)
ALTER TABLE sessions ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
"#,
    // the delegated identity tree: a node's parent, its scopes (a JSON list; NULL for a root
    // the owner enrolled) and the node whose revocation revoked it
    r#"
ALTER TABLE agents ADD COLUMN parent TEXT;
ALTER TABLE agents ADD COLUMN scopes TEXT;
ALTER TABLE agents ADD COLUMN revoked_by TEXT;
CREATE INDEX agents_parent ON agents(parent) WHERE parent IS NOT NULL;
"#,
    // the index `rooms_with_claims` reads (a migration dropped `tasks_claimed` with the
    // lease's own index; each sweep then scanned every task)
    r#"
CREATE INDEX IF NOT EXISTS tasks_claimed_room ON tasks(status, room) WHERE status = 'claimed';
"#,
    // collaborations: the record the owner started (its spec as JSON: profile, pack, prompts,
    // role agents), each phase's runs, and the approval queue
    r#"
CREATE TABLE collabs (
    id TEXT PRIMARY KEY,
    room TEXT NOT NULL,
    project TEXT,
    goal TEXT NOT NULL,
    orchestrator TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX collabs_state ON collabs(state, id);
CREATE TABLE collab_runs (
    collab TEXT NOT NULL,
    phase TEXT NOT NULL,
    run INTEGER NOT NULL,
    task TEXT,
    state TEXT NOT NULL,
    reads TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    ended_ms INTEGER,
    PRIMARY KEY (collab, phase, run)
) STRICT;
CREATE TABLE collab_approvals (
    id TEXT PRIMARY KEY,
    collab TEXT NOT NULL,
    phase TEXT NOT NULL,
    run INTEGER NOT NULL,
    digest TEXT NOT NULL,
    input TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    decided_ms INTEGER,
    note TEXT
) STRICT;
CREATE INDEX collab_approvals_collab ON collab_approvals(collab, created_ms);
"#,
    // the owner's composition grants: which rooms an agent may read composed (rooms: a
    // sorted JSON list)
    r#"
CREATE TABLE compositions (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL REFERENCES agents(name),
    rooms TEXT NOT NULL,
    project TEXT,
    created_ms INTEGER NOT NULL,
    revoked_ms INTEGER
) STRICT;
CREATE INDEX compositions_agent ON compositions(agent, id);
"#,
];

/// An owner's grant to read a set of rooms composed (`room compose grant`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompositionRow {
    pub id: String,
    pub agent: String,
    /// Sorted, each once.
    pub rooms: Vec<String>,
    /// The project the rooms share (none: coordination rooms).
    pub project: Option<String>,
    pub created_ms: u64,
    pub revoked_ms: Option<u64>,
}

/// Grants listed at most.
pub const COMPOSITIONS_PAGE_MAX: usize = 1000;

const COMPOSITION_COLS: &str = "id, agent, rooms, project, created_ms, revoked_ms";

fn composition_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CompositionRow> {
    let rooms: String = r.get(2)?;
    Ok(CompositionRow {
        id: r.get(0)?,
        agent: r.get(1)?,
        rooms: serde_json::from_str(&rooms).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(e))
        })?,
        project: r.get(3)?,
        created_ms: u(r.get(4)?),
        revoked_ms: r.get::<_, Option<i64>>(5)?.map(u),
    })
}

/// A collaboration as the owner started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollabRow {
    pub id: String,
    pub room: String,
    pub project: Option<String>,
    pub goal: String,
    /// The delegated root that dispatches its phases.
    pub orchestrator: String,
    /// What it runs, as JSON (the collaboration floor's to read: profile, pack, prompts,
    /// the agent of each role).
    pub spec: String,
    /// `running`, `done`, `cancelled` or `failed`.
    pub state: String,
    pub created_ms: u64,
    pub updated_ms: u64,
}

const COLLAB_COLS: &str =
    "id, room, project, goal, orchestrator, spec, state, created_ms, updated_ms";

fn collab_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CollabRow> {
    Ok(CollabRow {
        id: r.get(0)?,
        room: r.get(1)?,
        project: r.get(2)?,
        goal: r.get(3)?,
        orchestrator: r.get(4)?,
        spec: r.get(5)?,
        state: r.get(6)?,
        created_ms: u(r.get(7)?),
        updated_ms: u(r.get(8)?),
    })
}

/// One run of one phase of a collaboration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollabRunRow {
    pub collab: String,
    pub phase: String,
    /// 1 for its first run, one more for each after.
    pub run: u32,
    /// The task the run is (none while it waits for approval).
    pub task: Option<String>,
    /// `approval` (waiting for the person), `dispatching` (its task or wake not yet all
    /// made), `running`, `done`, `failed` or `rejected`.
    pub state: String,
    /// The version of each artifact it read when it started (a JSON object).
    pub reads: String,
    pub started_ms: u64,
    pub ended_ms: Option<u64>,
}

const RUN_COLS: &str = "collab, phase, run, task, state, reads, started_ms, ended_ms";

fn run_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CollabRunRow> {
    Ok(CollabRunRow {
        collab: r.get(0)?,
        phase: r.get(1)?,
        run: r.get::<_, i64>(2)? as u32,
        task: r.get(3)?,
        state: r.get(4)?,
        reads: r.get(5)?,
        started_ms: u(r.get(6)?),
        ended_ms: r.get::<_, Option<i64>>(7)?.map(u),
    })
}

/// One request in a collaboration's approval queue, bound to the digest of what it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRow {
    pub id: String,
    pub collab: String,
    pub phase: String,
    pub run: u32,
    /// SHA-256 of the canonical JSON of `input`.
    pub digest: String,
    /// What the person is shown (JSON).
    pub input: String,
    /// `pending`, `approved`, `rejected` or `stale`.
    pub state: String,
    pub created_ms: u64,
    pub decided_ms: Option<u64>,
    pub note: Option<String>,
}

const APPROVAL_COLS: &str =
    "id, collab, phase, run, digest, input, state, created_ms, decided_ms, note";

fn approval_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRow> {
    Ok(ApprovalRow {
        id: r.get(0)?,
        collab: r.get(1)?,
        phase: r.get(2)?,
        run: r.get::<_, i64>(3)? as u32,
        digest: r.get(4)?,
        input: r.get(5)?,
        state: r.get(6)?,
        created_ms: u(r.get(7)?),
        decided_ms: r.get::<_, Option<i64>>(8)?.map(u),
        note: r.get(9)?,
    })
}

/// Holds one listing shows at most (oldest first).
pub const HOLDS_PAGE_MAX: usize = 256;

/// An item a cancel held until an operator reconciles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRow {
    pub id: String,
    pub room: String,
    /// `destination_operation` or `model_request`.
    pub kind: String,
    pub item: String,
    pub agent: Option<String>,
    pub task: Option<String>,
    /// The seq of the cancel record that held it.
    pub cancel_seq: u64,
    pub created_ms: u64,
    pub resolved_seq: Option<u64>,
    pub resolved_ms: Option<u64>,
    pub resolved_by: Option<String>,
    pub outcome: Option<String>,
    pub evidence: Option<String>,
}

const HOLD_COLS: &str = "id, room, kind, item, agent, task, cancel_seq, created_ms, resolved_seq, resolved_ms, resolved_by, outcome, evidence";

fn hold_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<HoldRow> {
    Ok(HoldRow {
        id: r.get(0)?,
        room: r.get(1)?,
        kind: r.get(2)?,
        item: r.get(3)?,
        agent: r.get(4)?,
        task: r.get(5)?,
        cancel_seq: u(r.get(6)?),
        created_ms: u(r.get(7)?),
        resolved_seq: r.get::<_, Option<i64>>(8)?.map(u),
        resolved_ms: r.get::<_, Option<i64>>(9)?.map(u),
        resolved_by: r.get(10)?,
        outcome: r.get(11)?,
        evidence: r.get(12)?,
    })
}

/// An operator's resolution of a hold, as its `reconciled` record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldResolution<'a> {
    pub seq: u64,
    pub at_ms: u64,
    pub by: &'a str,
    pub outcome: &'a str,
    pub evidence: &'a str,
}

/// Sessions one listing shows at most (newest first).
pub const SESSIONS_PAGE_MAX: usize = 256;

/// A native session as the session factory keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// `sf_<host>_<native>`.
    pub id: String,
    pub agent: String,
    /// The adapter family that reached it (`acp`, or the ACP preset: `claude`, `codex`, …).
    pub host: String,
    pub native: String,
    pub cwd: String,
    pub transport: String,
    /// The model profile its newest launch ran under, as JSON (`{adapter, preset, model}` of
    /// its route); none for a session that is the agent's own.
    pub model: Option<String>,
    /// The proof cursor: the rung its newest launch reached.
    pub proof: String,
    pub parent: Option<String>,
    /// Its newest launch (the lease on it).
    pub launch: String,
    pub launches: u64,
    /// The agent offered `session/load` for it.
    pub loadable: bool,
    /// Launches of its agent deliver into it (`spawn_policy = "never"`).
    pub bound: bool,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The tags its route gave it at its newest launch.
    pub tags: Vec<String>,
}

const SESSION_COLS: &str = "id, agent, host, native, cwd, transport, model, proof, parent, launch, launches, loadable, bound, created_ms, updated_ms, tags";

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        id: r.get(0)?,
        agent: r.get(1)?,
        host: r.get(2)?,
        native: r.get(3)?,
        cwd: r.get(4)?,
        transport: r.get(5)?,
        model: r.get(6)?,
        proof: r.get(7)?,
        parent: r.get(8)?,
        launch: r.get(9)?,
        launches: u(r.get(10)?),
        loadable: r.get::<_, i64>(11)? != 0,
        bound: r.get::<_, i64>(12)? != 0,
        created_ms: u(r.get(13)?),
        updated_ms: u(r.get(14)?),
        tags: {
            let text: String = r.get(15)?;
            serde_json::from_str(&text).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(15, rusqlite::types::Type::Text, e.into())
            })?
        },
    })
}

/// The most launches `launches_of_wake` lists (a permit is launched once; retries are later).
pub const LAUNCHES_OF_WAKE_MAX: usize = 16;

/// Insert a session or move an existing one on (its proof, newest launch, count); binding one
/// unbinds the agent's others in the same transaction. A session id already kept for another
/// agent is refused: one native session never speaks for two agents.
fn record_session(tx: &rusqlite::Transaction<'_>, s: &SessionRow) -> Result<()> {
    let owner: Option<String> = tx
        .query_row("SELECT agent FROM sessions WHERE id = ?1", [&s.id], |r| {
            r.get(0)
        })
        .optional()?;
    if owner.as_deref().is_some_and(|a| a != s.agent) {
        return Err(StoreError::Corrupt(format!(
            "session {} is kept for another agent than {}",
            s.id, s.agent
        )));
    }
    if s.bound {
        tx.execute(
            "UPDATE sessions SET bound = 0 WHERE agent = ?1 AND id != ?2",
            params![s.agent, s.id],
        )?;
    }
    tx.execute(
        &format!(
            "INSERT INTO sessions ({SESSION_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1, ?11, ?12, ?13, ?13, ?14)
             ON CONFLICT(id) DO UPDATE SET proof = excluded.proof, launch = excluded.launch,
               launches = launches + 1, loadable = excluded.loadable,
               bound = max(bound, excluded.bound), updated_ms = excluded.updated_ms,
               model = excluded.model, tags = excluded.tags"
        ),
        params![s.id, s.agent, s.host, s.native, s.cwd, s.transport, s.model, s.proof, s.parent,
            s.launch, i64::from(s.loadable), i64::from(s.bound), s.updated_ms as i64,
            serde_json::to_string(&s.tags).expect("tags serialize")],
    )?;
    Ok(())
}

/// One sealed permit as the queue stores it: its key and its canonical JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeRow {
    pub room: String,
    pub agent: String,
    pub source_event: String,
    pub created_ms: u64,
    pub permit: String,
    /// `queued` (waiting, valid when last checked) or `dead` (refused by dispatch).
    pub state: String,
    /// A dead permit's refusal code and its message.
    pub reason: Option<String>,
    pub detail: Option<String>,
}

/// One attempt to deliver a permit to a worker process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchRow {
    pub id: String,
    pub room: String,
    pub agent: String,
    pub source_event: String,
    /// SHA-256 of the launch's one-launch credential (the token itself is never stored).
    pub secret_sha256: String,
    pub permit_sha256: String,
    /// `starting` (process not yet claimed), `running` (claimed with its pid) or `ended`.
    pub state: String,
    pub pid: Option<u32>,
    pub created_ms: u64,
    pub not_after_ms: u64,
    pub ended_ms: Option<u64>,
    /// How it ended (`replied`, `process_exit_only`, `body_visible_pending_reply`,
    /// `timed_out`, `failed`, …).
    pub outcome: Option<String>,
    /// The highest rung of the proof ladder it reached (`dispatched`, `delivered_to_body`,
    /// `body_visible_pending_reply`, `wrong_body_rejected`, `replied`).
    pub proof: Option<String>,
    /// What its adapter reported, as JSON.
    pub detail: Option<String>,
    /// The `wake_delivery` receipt of the evidence its wake cited, as JSON.
    pub delivery: Option<String>,
    /// When the split-lock claim made it running.
    pub started_ms: Option<u64>,
    /// The control epoch and the room's cancel generation it was dispatched under.
    pub control_epoch: u64,
    pub cancel_gen: u64,
    /// A session launch's conversation: the agent's own MCP session that took the permit and
    /// whose reply answers it. None for a worker process (its conversation is `wake:<id>`).
    pub conversation: Option<String>,
    /// A broker response a revocation cut off while it was partly written
    /// (`severed_mid_response`), as JSON: the first such, kept.
    pub severed: Option<String>,
}

/// How a launch ended, as `launch_ended` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnd {
    pub at_ms: u64,
    pub outcome: String,
    pub proof: String,
    pub detail: Option<String>,
    /// The state its permit moves to (`replied`, `pending_reply`, `failed`).
    pub wake_state: String,
    /// The native session it ran in, recorded (or updated) with the end.
    pub session: Option<SessionRow>,
}

const LAUNCH_COLS: &str = "id, room, agent, source_event, secret_sha256, permit_sha256, state, pid, created_ms, not_after_ms, ended_ms, outcome, proof, detail, delivery, started_ms, control_epoch, cancel_gen, conversation, severed";

fn launch_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<LaunchRow> {
    Ok(LaunchRow {
        id: r.get(0)?,
        room: r.get(1)?,
        agent: r.get(2)?,
        source_event: r.get(3)?,
        secret_sha256: r.get(4)?,
        permit_sha256: r.get(5)?,
        state: r.get(6)?,
        pid: r.get::<_, Option<i64>>(7)?.map(|p| p as u32),
        created_ms: u(r.get(8)?),
        not_after_ms: u(r.get(9)?),
        ended_ms: r.get::<_, Option<i64>>(10)?.map(u),
        outcome: r.get(11)?,
        proof: r.get(12)?,
        detail: r.get(13)?,
        delivery: r.get(14)?,
        started_ms: r.get::<_, Option<i64>>(15)?.map(u),
        control_epoch: u(r.get(16)?),
        cancel_gen: u(r.get(17)?),
        conversation: r.get(18)?,
        severed: r.get(19)?,
    })
}

/// A revalidation's verdict on one queued permit: `dead` (a refusal code and its message)
/// when dispatch refused it.
#[derive(Debug, Clone)]
pub struct WakeVerdict {
    pub wake: WakeRow,
    pub dead: Option<(String, String)>,
}

/// A permit's dispatch state.
pub const WAKE_QUEUED: &str = "queued";
pub const WAKE_DEAD: &str = "dead";

/// What control.db says was acknowledged in one room: the seq of its last view reset (0: none)
/// and the source events of its newest queued wake permits (newest first, at most
/// `WAKE_WITNESSES_MAX`), each of which a journal that lost nothing still holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomWitnesses {
    pub reset_seq: u64,
    pub wake_sources: Vec<String>,
}

fn wake_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WakeRow> {
    Ok(WakeRow {
        room: r.get(0)?,
        agent: r.get(1)?,
        source_event: r.get(2)?,
        created_ms: u(r.get(3)?),
        permit: r.get(4)?,
        state: r.get(5)?,
        reason: r.get(6)?,
        detail: r.get(7)?,
    })
}

/// Newest wake permits of a room read as witnesses.
pub const WAKE_WITNESSES_MAX: usize = 64;

fn room_witnesses_of(conn: &Connection, room: &str) -> Result<RoomWitnesses> {
    let reset_seq: Option<i64> = conn
        .prepare_cached("SELECT reset_gen FROM rooms WHERE name = ?1")?
        .query_row([room], |r| r.get(0))
        .optional()?;
    let mut st = conn.prepare_cached(
        "SELECT DISTINCT source_event FROM
           (SELECT source_event FROM wakes WHERE room = ?1 ORDER BY created_ms DESC LIMIT ?2)",
    )?;
    let wake_sources = st
        .query_map(params![room, WAKE_WITNESSES_MAX as i64], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(RoomWitnesses {
        reset_seq: reset_seq.unwrap_or(0).max(0) as u64,
        wake_sources,
    })
}

/// `ControlStore::room_witnesses` without changing control.db: opened read-only, no pragma
/// set (`room verify`). Fails at once when a daemon holds control.db (it locks it exclusively).
pub fn read_room_witnesses(path: &Path, room: &str) -> Result<RoomWitnesses> {
    if !path.exists() {
        return Err(StoreError::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} does not exist", path.display()),
        )));
    }
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    // a running daemon holds the database exclusively: answer busy at once rather than wait
    // (rusqlite's default) five seconds per room
    conn.busy_timeout(std::time::Duration::ZERO)?;
    room_witnesses_of(&conn, room)
}

/// Most permits one `wakes` read returns.
pub const WAKES_PAGE_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRow {
    pub name: String,
    pub secret_sha256: String,
    pub registration_sha256: String,
    pub generation: u64,
    pub max_tier: String,
    pub host_kind: String,
    pub created_ms: u64,
    pub revoked_ms: Option<u64>,
    /// The agent it was delegated from (none: enrolled by the owner, a root of the tree).
    pub parent: Option<String>,
    /// The scopes it holds (none: a root enrolled by the owner, bounded by its tier only); a
    /// delegated agent's are a subset of its parent's.
    pub scopes: Option<Vec<String>>,
    /// The node whose revocation revoked it (itself, or an ancestor).
    pub revoked_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectRow {
    pub id: String,
    pub name: String,
    pub requested_root: String,
    pub canonical_root: String,
    pub dev: u64,
    pub ino: u64,
    pub mnt_id: u64,
    pub opened_ms: u64,
}

/// A member as a room's view sees it: its agent (None: unknown) and the verbs denied to it.
#[derive(Debug, Clone, Copy)]
pub struct MemberStanding<'a> {
    pub name: &'a str,
    pub agent: Option<&'a AgentRow>,
    pub denied: &'a [String],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomRow {
    pub name: String,
    pub graph_id: String,
    pub project_id: Option<String>,
    pub created_ms: u64,
    pub revision: u64,
    pub reset_gen: u64,
    pub reset_ms: Option<u64>,
    pub admission_gen: u64,
    /// Whether agents may write to the room (the owner closes and opens its admission).
    pub admission_open: bool,
    /// When the owner archived the room (read-only from then on), if it was.
    pub archived_ms: Option<u64>,
    /// The seq of its newest cancel or resume record (0 before any): a launch started under
    /// another generation no longer has its room's authority.
    pub cancel_gen: u64,
    /// Cancelled: nothing of it is dispatched until a control actor resumes it.
    pub cancelled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    pub id: String,
    pub room: String,
    pub project_id: Option<String>,
    pub title: String,
    pub owner: String,
    pub recipient: Option<String>,
    pub parent: Option<String>,
    pub status: TaskStatus,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Typed scopes (`namespace:resource`) a claim of this task leases exclusively.
    pub scopes: Vec<String>,
    /// What the work must achieve, in words.
    pub requirements: Vec<String>,
    /// The checks `done` measures.
    pub acceptance: Vec<room_core::acceptance::Check>,
    /// Leases nothing, and its subtasks may not either.
    pub coordination_only: bool,
    /// The fencing generation of the task's newest lease, and whether it is held now.
    pub lease_gen: Option<u64>,
    pub lease_held: bool,
    /// Bumped by each amendment of the task's terms (0: as created).
    pub revision: u64,
    /// The authority keys the newest claim pinned (key to value or digest).
    pub claim_pin: Option<BTreeMap<String, String>>,
    /// An operator's override of `task_acceptance_required`: the recorded reason.
    pub override_reason: Option<String>,
    /// The verified successor that superseded this task.
    pub successor: Option<String>,
    /// Governed by its project's governing source.
    pub governed: bool,
    /// The parent's revision when this task was delegated under it: an amendment of the
    /// parent since invalidates this task's ancestry.
    pub parent_revision: Option<u64>,
    /// The sources its workers are staged with.
    pub stage: Vec<room_core::stage::Selection>,
}

/// The newest acceptance evaluation of a task (by `done` or a dry-run check): an observation,
/// not task state; the journal holds what `done` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCheckRow {
    pub task: String,
    pub at_ms: u64,
    pub pass: bool,
    /// The evaluation as JSON, in the seed's Exhibit 4 shape.
    pub evaluation: String,
}

const TASK_COLS: &str = "id, room, project_id, title, owner, recipient, parent, status, created_ms, updated_ms, scopes, requirements, acceptance, coordination_only, lease_gen, lease_held, revision, claim_pin, override_reason, successor, governed, parent_revision, stage";

fn task_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TaskRow> {
    let scopes: String = r.get(10)?;
    Ok(TaskRow {
        id: r.get(0)?,
        room: r.get(1)?,
        project_id: r.get(2)?,
        title: r.get(3)?,
        owner: r.get(4)?,
        recipient: r.get(5)?,
        parent: r.get(6)?,
        status: {
            let s: String = r.get(7)?;
            TaskStatus::parse(&s).ok_or_else(|| {
                let e = StoreError::Corrupt(format!("task status {s:?}"));
                rusqlite::Error::FromSqlConversionFailure(7, rusqlite::types::Type::Text, e.into())
            })?
        },
        created_ms: u(r.get(8)?),
        updated_ms: u(r.get(9)?),
        scopes: json_col(10, &scopes)?,
        requirements: json_col(11, &r.get::<_, String>(11)?)?,
        acceptance: json_col(12, &r.get::<_, String>(12)?)?,
        coordination_only: r.get(13)?,
        lease_gen: r.get::<_, Option<i64>>(14)?.map(u),
        lease_held: r.get(15)?,
        revision: u(r.get(16)?),
        claim_pin: match r.get::<_, Option<String>>(17)? {
            Some(text) => Some(json_col(17, &text)?),
            None => None,
        },
        override_reason: r.get(18)?,
        successor: r.get(19)?,
        governed: r.get(20)?,
        parent_revision: r.get::<_, Option<i64>>(21)?.map(u),
        stage: json_col(22, &r.get::<_, String>(22)?)?,
    })
}

fn json_col<T: serde::de::DeserializeOwned>(i: usize, text: &str) -> rusqlite::Result<T> {
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// A row error that `task_from_row` found to be corruption (a status no version writes) is
/// reported as such; any other stays an SQLite error.
fn task_err(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::FromSqlConversionFailure(_, _, inner) if inner.is::<StoreError>() => {
            *inner.downcast::<StoreError>().expect("checked by is")
        }
        e => StoreError::Sql(e),
    }
}

/// In-memory copy of the rows every call reads (principals, policy, rooms, rosters). The
/// daemon owns control.db exclusively and every write goes through this type, which reloads
/// what it wrote, so the copy is never stale; it spares the global lock a query per check.
#[derive(Default)]
struct Cache {
    epoch: u64,
    agents: HashMap<String, AgentRow>,
    by_secret: HashMap<String, String>,
    denied: HashMap<String, Vec<String>>,
    projects: Vec<ProjectRow>,
    rooms: BTreeMap<String, RoomRow>,
    members: HashMap<String, Vec<String>>,
    /// Per room, its view generation digest (see `view_gen`), dropped when the room reloads.
    view_gens: HashMap<String, String>,
}

pub struct SqliteControl {
    conn: Connection,
    /// Writes through this handle, for the change stamp.
    writes: u64,
    cache: Cache,
    /// A reload after a failed write failed too: the cache may be partial (it fails closed)
    /// until a reload succeeds, which is tried again on every use.
    stale: bool,
}

fn u(v: i64) -> u64 {
    v as u64
}

impl SqliteControl {
    pub fn open(path: &Path, cfg: &SqliteConfig) -> Result<SqliteControl> {
        let conn = crate::index::open_owned(path, cfg, MIGRATIONS)?;
        let mut c = SqliteControl {
            conn,
            writes: 0,
            cache: Cache::default(),
            stale: false,
        };
        c.load_cache()?;
        Ok(c)
    }

    /// Fill the cache from the database, as it stands.
    fn load_cache(&mut self) -> Result<()> {
        let c = self;
        c.cache = Cache::default();
        c.cache.epoch = c.load_control_epoch()?;
        for a in c.load_agents()? {
            c.reload_agent(&a.name)?;
        }
        c.cache.projects = c.load_projects()?;
        for r in c.load_rooms()? {
            c.reload_room(&r.name)?;
        }
        Ok(())
    }

    fn reload_agent(&mut self, name: &str) -> Result<()> {
        // a member's standing is part of every view it is in
        self.cache.view_gens.clear();
        if let Some(old) = self.cache.agents.remove(name) {
            self.cache.by_secret.remove(&old.secret_sha256);
        }
        if let Some(a) = self.load_agent(name)? {
            self.cache
                .by_secret
                .insert(a.secret_sha256.clone(), a.name.clone());
            self.cache
                .denied
                .insert(a.name.clone(), self.load_denied_verbs(name)?);
            self.cache.agents.insert(a.name.clone(), a);
        }
        Ok(())
    }

    fn reload_room(&mut self, name: &str) -> Result<()> {
        self.cache.view_gens.remove(name);
        match self.load_room(name)? {
            Some(r) => {
                self.cache
                    .members
                    .insert(name.to_string(), self.load_members(name)?);
                self.cache.rooms.insert(name.to_string(), r);
            }
            None => {
                self.cache.rooms.remove(name);
                self.cache.members.remove(name);
            }
        }
        Ok(())
    }

    fn load_meta_u64(&self, key: &str) -> Result<u64> {
        let v: String =
            self.conn
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))?;
        v.parse()
            .map_err(|_| StoreError::Corrupt(format!("meta {key} {v:?}")))
    }

    fn load_control_epoch(&self) -> Result<u64> {
        let v: String = self.conn.query_row(
            "SELECT value FROM meta WHERE key = 'control_epoch'",
            [],
            |r| r.get(0),
        )?;
        v.parse()
            .map_err(|_| StoreError::Corrupt(format!("control_epoch {v:?}")))
    }

    fn load_agent(&self, name: &str) -> Result<Option<AgentRow>> {
        self.agent_where("name = ?1", name)
    }

    fn agent_where(&self, clause: &str, v: &str) -> Result<Option<AgentRow>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT name, secret_sha256, registration_sha256, generation, max_tier, host_kind, created_ms, revoked_ms,
                        parent, scopes, revoked_by
                 FROM agents WHERE {clause}"
            ))?
            .query_row([v], |r| {
                let scopes: Option<String> = r.get(9)?;
                Ok((
                    AgentRow {
                        name: r.get(0)?,
                        secret_sha256: r.get(1)?,
                        registration_sha256: r.get(2)?,
                        generation: u(r.get(3)?),
                        max_tier: r.get(4)?,
                        host_kind: r.get(5)?,
                        created_ms: u(r.get(6)?),
                        revoked_ms: r.get::<_, Option<i64>>(7)?.map(u),
                        parent: r.get(8)?,
                        scopes: None,
                        revoked_by: r.get(10)?,
                    },
                    scopes,
                ))
            })
            .optional()?
            .map(|(mut a, scopes)| {
                a.scopes = match scopes {
                    None => None,
                    Some(t) => Some(serde_json::from_str(&t).map_err(|e| {
                        StoreError::Corrupt(format!("agent {}: scopes {t:?}: {e}", a.name))
                    })?),
                };
                Ok::<_, StoreError>(a)
            })
            .transpose()
    }

    fn load_agents(&self) -> Result<Vec<AgentRow>> {
        let names: Vec<String> = self
            .conn
            .prepare("SELECT name FROM agents ORDER BY name")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let mut out = Vec::new();
        for n in names {
            out.extend(self.load_agent(&n)?);
        }
        Ok(out)
    }

    fn load_denied_verbs(&self, agent: &str) -> Result<Vec<String>> {
        Ok(self
            .conn
            .prepare_cached("SELECT verb FROM denied_verbs WHERE agent = ?1 ORDER BY verb")?
            .query_map([agent], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn load_projects(&self) -> Result<Vec<ProjectRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT id, name, requested_root, canonical_root, dev, ino, mnt_id, opened_ms FROM projects ORDER BY opened_ms, id",
            )?
            .query_map([], |r| {
                Ok(ProjectRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    requested_root: r.get(2)?,
                    canonical_root: r.get(3)?,
                    dev: u(r.get(4)?),
                    ino: u(r.get(5)?),
                    mnt_id: u(r.get(6)?),
                    opened_ms: u(r.get(7)?),
                })
            })?
            .collect::<rusqlite::Result<_>>()?)
    }

    const ROOM_COLS: &'static str = "name, graph_id, project_id, created_ms, revision, reset_gen, reset_ms, admission_gen, archived_ms, admission_open, cancel_gen, cancelled";

    fn room_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<RoomRow> {
        Ok(RoomRow {
            name: r.get(0)?,
            graph_id: r.get(1)?,
            project_id: r.get(2)?,
            created_ms: u(r.get(3)?),
            revision: u(r.get(4)?),
            reset_gen: u(r.get(5)?),
            reset_ms: r.get::<_, Option<i64>>(6)?.map(u),
            admission_gen: u(r.get(7)?),
            archived_ms: r.get::<_, Option<i64>>(8)?.map(u),
            admission_open: r.get(9)?,
            cancel_gen: u(r.get(10)?),
            cancelled: r.get(11)?,
        })
    }

    fn load_rooms(&self) -> Result<Vec<RoomRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM rooms ORDER BY name",
                Self::ROOM_COLS
            ))?
            .query_map([], Self::room_from)?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn load_room(&self, name: &str) -> Result<Option<RoomRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM rooms WHERE name = ?1",
                Self::ROOM_COLS
            ))?
            .query_row([name], Self::room_from)
            .optional()?)
    }

    fn load_members(&self, room: &str) -> Result<Vec<String>> {
        Ok(self
            .conn
            .prepare_cached("SELECT agent FROM members WHERE room = ?1 ORDER BY agent")?
            .query_map([room], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    }
}

impl ControlStore for SqliteControl {
    fn change_stamp(&self) -> Result<ChangeStamp> {
        Ok(ChangeStamp {
            external: crate::index::data_version(&self.conn)?,
            local: self.writes,
        })
    }

    fn control_epoch(&self) -> Result<u64> {
        Ok(self.cache.epoch)
    }

    fn agent(&self, name: &str) -> Result<Option<AgentRow>> {
        Ok(self.cache.agents.get(name).cloned())
    }

    fn agent_by_secret(&self, secret_sha256: &str) -> Result<Option<AgentRow>> {
        Ok(self
            .cache
            .by_secret
            .get(secret_sha256)
            .and_then(|n| self.cache.agents.get(n))
            .cloned())
    }

    fn agents(&self) -> Result<Vec<AgentRow>> {
        let mut v: Vec<AgentRow> = self.cache.agents.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    fn denied_verbs(&self, agent: &str) -> Result<Vec<String>> {
        Ok(self.cache.denied.get(agent).cloned().unwrap_or_default())
    }

    fn projects(&self) -> Result<Vec<ProjectRow>> {
        Ok(self.cache.projects.clone())
    }

    fn project(&self, id: &str) -> Result<Option<ProjectRow>> {
        Ok(self.cache.projects.iter().find(|p| p.id == id).cloned())
    }

    fn rooms(&self) -> Result<Vec<RoomRow>> {
        Ok(self.cache.rooms.values().cloned().collect())
    }

    fn room(&self, name: &str) -> Result<Option<RoomRow>> {
        Ok(self.cache.rooms.get(name).cloned())
    }

    /// The room's view generation, computed by `digest` from its row and roster once per change
    /// of either (every sync and turn needs it). `None`: no such room.
    fn view_gen(
        &mut self,
        room: &str,
        digest: &dyn Fn(&RoomRow, &[MemberStanding<'_>]) -> String,
    ) -> Option<String> {
        if let Some(v) = self.cache.view_gens.get(room) {
            return Some(v.clone());
        }
        let row = self.cache.rooms.get(room)?;
        let members = self.cache.members.get(room).map_or(&[][..], Vec::as_slice);
        let standings: Vec<MemberStanding<'_>> = members
            .iter()
            .map(|m| MemberStanding {
                name: m,
                agent: self.cache.agents.get(m),
                denied: self.cache.denied.get(m).map_or(&[][..], Vec::as_slice),
            })
            .collect();
        let v = digest(row, &standings);
        self.cache.view_gens.insert(room.to_string(), v.clone());
        Some(v)
    }

    fn members(&self, room: &str) -> Result<Vec<String>> {
        Ok(self.cache.members.get(room).cloned().unwrap_or_default())
    }

    fn is_member(&self, room: &str, agent: &str) -> Result<bool> {
        Ok(self
            .cache
            .members
            .get(room)
            .is_some_and(|m| m.iter().any(|a| a == agent)))
    }

    fn retired_secret(&self, secret_sha256: &str) -> Result<Option<(String, String)>> {
        Ok(self
            .conn
            .prepare_cached("SELECT agent, why FROM retired_secrets WHERE secret_sha256 = ?1")?
            .query_row([secret_sha256], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    fn insert_agent(&mut self, a: &AgentRow) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "INSERT INTO agents (name, secret_sha256, registration_sha256, generation, max_tier, host_kind, created_ms, revoked_ms, parent, scopes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, ?8, ?9)",
                params![a.name, a.secret_sha256, a.registration_sha256, a.generation as i64, a.max_tier, a.host_kind, a.created_ms as i64,
                    a.parent, a.scopes.as_ref().map(|s| serde_json::to_string(s).expect("a list of strings serializes"))],
            )?;
            c.reload_agent(&a.name)
        })
    }

    /// Replace an agent's secret; the old digest is retired in the same transaction.
    fn replace_secret(
        &mut self,
        old: &AgentRow,
        new_secret: &str,
        new_registration: &str,
        now_ms: u64,
    ) -> Result<()> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            tx.execute(
                "INSERT OR IGNORE INTO retired_secrets (secret_sha256, agent, retired_ms, why) VALUES (?1, ?2, ?3, 'rotated')",
                params![old.secret_sha256, old.name, now_ms as i64],
            )?;
            tx.execute(
                "UPDATE agents SET secret_sha256 = ?2, registration_sha256 = ?3, generation = generation + 1, revoked_ms = NULL WHERE name = ?1",
                params![old.name, new_secret, new_registration],
            )?;
            tx.commit()?;
            c.reload_agent(&old.name)
        })
    }

    fn revoke(&mut self, a: &AgentRow, now_ms: u64) -> Result<()> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            tx.execute(
                "INSERT OR IGNORE INTO retired_secrets (secret_sha256, agent, retired_ms, why) VALUES (?1, ?2, ?3, 'revoked')",
                params![a.secret_sha256, a.name, now_ms as i64],
            )?;
            tx.execute(
                "UPDATE agents SET revoked_ms = ?2, revoked_by = ?1 WHERE name = ?1",
                params![a.name, now_ms as i64],
            )?;
            tx.commit()?;
            c.reload_agent(&a.name)
        })
    }

    fn revoke_subtree(&mut self, root: &str, now_ms: u64, depth_max: u32) -> Result<Vec<String>> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            let names: Vec<(String, String, bool)> = tx
                .prepare(
                    "WITH RECURSIVE sub(name, depth) AS (
                        SELECT ?1, 0
                        UNION ALL
                        SELECT a.name, sub.depth + 1 FROM agents a JOIN sub ON a.parent = sub.name
                        WHERE sub.depth < ?2)
                     SELECT a.name, a.secret_sha256, a.revoked_ms IS NOT NULL
                     FROM agents a JOIN sub ON a.name = sub.name",
                )?
                .query_map(params![root, depth_max as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let mut revoked = Vec::new();
            for (name, secret, already) in names {
                if already {
                    continue;
                }
                tx.execute(
                    "INSERT OR IGNORE INTO retired_secrets (secret_sha256, agent, retired_ms, why) VALUES (?1, ?2, ?3, 'revoked')",
                    params![secret, name, now_ms as i64],
                )?;
                tx.execute(
                    "UPDATE agents SET revoked_ms = ?2, revoked_by = ?3 WHERE name = ?1",
                    params![name, now_ms as i64, root],
                )?;
                revoked.push(name);
            }
            tx.commit()?;
            for n in &revoked {
                c.reload_agent(n)?;
            }
            Ok(revoked)
        })
    }

    fn set_max_tier(&mut self, agent: &str, tier: &str) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "UPDATE agents SET max_tier = ?2 WHERE name = ?1",
                params![agent, tier],
            )?;
            c.reload_agent(agent)
        })
    }

    fn set_scopes(&mut self, agent: &str, scopes: &[String]) -> Result<()> {
        let text = serde_json::to_string(scopes).expect("a list of strings serializes");
        self.write(|c| {
            c.conn.execute(
                "UPDATE agents SET scopes = ?2 WHERE name = ?1",
                params![agent, text],
            )?;
            c.reload_agent(agent)
        })
    }

    fn set_verb_denied(&mut self, agent: &str, verb: &str, denied: bool) -> Result<()> {
        self.write(|c| {
            if denied {
                c.conn.execute(
                    "INSERT OR IGNORE INTO denied_verbs (agent, verb) VALUES (?1, ?2)",
                    params![agent, verb],
                )?;
            } else {
                c.conn.execute(
                    "DELETE FROM denied_verbs WHERE agent = ?1 AND verb = ?2",
                    params![agent, verb],
                )?;
            }
            c.reload_agent(agent)
        })
    }

    fn insert_project(&mut self, p: &ProjectRow) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "INSERT INTO projects (id, name, requested_root, canonical_root, dev, ino, mnt_id, opened_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![p.id, p.name, p.requested_root, p.canonical_root, p.dev as i64, p.ino as i64, p.mnt_id as i64, p.opened_ms as i64],
            )?;
            c.cache.projects = c.load_projects()?;
            Ok(())
        })
    }

    fn insert_room(&mut self, r: &RoomRow, members: &[String]) -> Result<()> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            tx.execute(
                "INSERT INTO rooms (name, graph_id, project_id, created_ms, revision, reset_gen, reset_ms, admission_gen, archived_ms, admission_open)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![r.name, r.graph_id, r.project_id, r.created_ms as i64, r.revision as i64, r.reset_gen as i64, r.reset_ms.map(|v| v as i64), r.admission_gen as i64, r.archived_ms.map(|v| v as i64), r.admission_open],
            )?;
            for m in members {
                tx.execute(
                    "INSERT OR IGNORE INTO members (room, agent) VALUES (?1, ?2)",
                    params![r.name, m],
                )?;
            }
            tx.commit()?;
            c.reload_room(&r.name)
        })
    }

    /// Add a member; bumps the room's revision (the participant set is part of every view).
    fn archive_room(&mut self, name: &str, at_ms: u64) -> Result<bool> {
        self.write(|c| {
            let n = c.conn.execute(
                "UPDATE rooms SET archived_ms = ?2 WHERE name = ?1 AND archived_ms IS NULL",
                params![name, at_ms as i64],
            )?;
            c.reload_room(name)?;
            Ok(n == 1)
        })
    }

    fn tasks_open_count(&self, room: &str, owner: &str) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached(
                "SELECT count(*) FROM tasks WHERE room = ?1 AND owner = ?2
                   AND status IN ('open', 'claimed', 'blocked')",
            )?
            .query_row(params![room, owner], |r| r.get(0))?;
        Ok(n as u64)
    }

    fn task_ids_in(&self, rooms: &[String], prefix: &str, limit: usize) -> Result<Vec<String>> {
        // the rooms as one JSON array (no bound on their number from SQLite's parameters); the
        // prefix compared as a prefix, not as a LIKE pattern (ids hold `_`)
        let rooms = serde_json::to_string(rooms).expect("names serialize");
        let mut st = self.conn.prepare_cached(
            "SELECT id FROM tasks WHERE room IN (SELECT value FROM json_each(?1))
               AND substr(id, 1, length(?2)) = ?2 ORDER BY id LIMIT ?3",
        )?;
        let ids = st.query_map(params![rooms, prefix, limit as i64], |r| r.get(0))?;
        Ok(ids.collect::<rusqlite::Result<_>>()?)
    }

    fn rooms_with_claims(&self) -> Result<Vec<String>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT DISTINCT room FROM tasks INDEXED BY tasks_claimed_room
                 WHERE status = 'claimed' ORDER BY room",
            )?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn remove_room(&mut self, name: &str) -> Result<bool> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            tx.execute("DELETE FROM members WHERE room = ?1", [name])?;
            let n = tx.execute("DELETE FROM rooms WHERE name = ?1", [name])?;
            tx.commit()?;
            c.reload_room(name)?;
            Ok(n > 0)
        })
    }

    fn add_member(&mut self, room: &str, agent: &str) -> Result<bool> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            let n = tx.execute(
                "INSERT OR IGNORE INTO members (room, agent) VALUES (?1, ?2)",
                params![room, agent],
            )?;
            if n > 0 {
                tx.execute(
                    "UPDATE rooms SET revision = revision + 1 WHERE name = ?1",
                    [room],
                )?;
            }
            tx.commit()?;
            c.reload_room(room)?;
            Ok(n > 0)
        })
    }

    /// Reset the room's view as of the `room_reset` record at `seq`; replaying it is a no-op.
    fn reset_room_at(&mut self, room: &str, seq: u64, at_ms: u64) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "UPDATE rooms SET reset_gen = ?2, revision = revision + 1, reset_ms = ?3 WHERE name = ?1 AND reset_gen < ?2",
                params![room, seq as i64, at_ms as i64],
            )?;
            c.reload_room(room)
        })
    }

    fn set_cancelled(
        &mut self,
        room: &str,
        seq: u64,
        cancel: Option<&crate::backend::CancelEffect<'_>>,
    ) -> Result<()> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            let n = tx.execute(
                "UPDATE rooms SET cancel_gen = ?2, cancelled = ?3, revision = revision + 1
                 WHERE name = ?1 AND cancel_gen < ?2",
                params![room, seq as i64, cancel.is_some()],
            )?;
            if n == 1
                && let Some(e) = cancel
            {
                // queued, deferred and unclaimed permits (dispatched to a launch whose worker
                // has not claimed it) die with the cancel, never to be retried
                tx.execute(
                    "UPDATE wakes SET state = 'dead', reason = 'room_cancelled', detail = ?2,
                        checked_ms = ?3
                     WHERE room = ?1 AND (state = 'queued' OR (state = 'dispatched' AND EXISTS (
                        SELECT 1 FROM launches l WHERE l.room = wakes.room
                          AND l.agent = wakes.agent AND l.source_event = wakes.source_event
                          AND l.state = 'starting')))",
                    params![room, e.why, e.at_ms as i64],
                )?;
                let mut st = tx.prepare_cached(&format!(
                    "INSERT OR IGNORE INTO holds ({HOLD_COLS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL, NULL, NULL, NULL, NULL)"
                ))?;
                for h in e.held {
                    st.execute(params![
                        h.hold,
                        room,
                        h.kind,
                        h.item,
                        h.agent,
                        h.task,
                        seq as i64,
                        e.at_ms as i64
                    ])?;
                }
            }
            tx.commit()?;
            c.reload_room(room)
        })
    }

    fn wakes_dead_count(&self, room: &str, reason: &str) -> Result<u64> {
        let n: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM wakes WHERE room = ?1 AND state = 'dead' AND reason = ?2",
            params![room, reason],
            |r| r.get(0),
        )?;
        Ok(u(n))
    }

    fn holds(&self, room: &str, limit: usize) -> Result<Vec<HoldRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {HOLD_COLS} FROM holds WHERE room = ?1 ORDER BY created_ms, id LIMIT ?2"
        ))?;
        let rows = st.query_map(
            params![room, limit.min(HOLDS_PAGE_MAX) as i64],
            hold_from_row,
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn insert_collab(&mut self, c: &CollabRow) -> Result<()> {
        self.write(|s| {
            s.conn.execute(
                &format!("INSERT INTO collabs ({COLLAB_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"),
                params![c.id, c.room, c.project, c.goal, c.orchestrator, c.spec, c.state,
                    c.created_ms as i64, c.updated_ms as i64],
            )?;
            Ok(())
        })
    }

    fn insert_composition(&mut self, g: &CompositionRow) -> Result<()> {
        let rooms = serde_json::to_string(&g.rooms).expect("a list of names serializes");
        self.write(|s| {
            s.conn.execute(
                &format!(
                    "INSERT INTO compositions ({COMPOSITION_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
                ),
                params![
                    g.id,
                    g.agent,
                    rooms,
                    g.project,
                    g.created_ms as i64,
                    g.revoked_ms.map(|v| v as i64)
                ],
            )?;
            Ok(())
        })
    }

    fn composition(&self, id: &str) -> Result<Option<CompositionRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {COMPOSITION_COLS} FROM compositions WHERE id = ?1"
            ))?
            .query_row([id], composition_from_row)
            .optional()?)
    }

    fn revoke_composition(&mut self, id: &str, now_ms: u64) -> Result<bool> {
        self.write(|s| {
            Ok(s.conn.execute(
                "UPDATE compositions SET revoked_ms = ?2 WHERE id = ?1 AND revoked_ms IS NULL",
                params![id, now_ms as i64],
            )? == 1)
        })
    }

    fn compositions(&self, agent: Option<&str>, limit: usize) -> Result<Vec<CompositionRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {COMPOSITION_COLS} FROM compositions WHERE ?1 IS NULL OR agent = ?1
             ORDER BY id LIMIT ?2"
        ))?;
        let limit = limit.min(COMPOSITIONS_PAGE_MAX) as i64;
        let rows = st.query_map(params![agent, limit], composition_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn active_compositions(&self, agent: &str) -> Result<Vec<CompositionRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {COMPOSITION_COLS} FROM compositions WHERE agent = ?1 AND revoked_ms IS NULL
             ORDER BY id LIMIT ?2"
        ))?;
        let rows = st.query_map(
            params![agent, COMPOSITIONS_PAGE_MAX as i64],
            composition_from_row,
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn collab(&self, id: &str) -> Result<Option<CollabRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {COLLAB_COLS} FROM collabs WHERE id = ?1"))?
            .query_row([id], collab_from_row)
            .optional()?)
    }

    fn collabs(&self, state: Option<&str>, limit: usize) -> Result<Vec<CollabRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {COLLAB_COLS} FROM collabs WHERE ?1 IS NULL OR state = ?1 ORDER BY id LIMIT ?2"
        ))?;
        let rows = st.query_map(params![state, limit as i64], collab_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn set_collab_state(&mut self, id: &str, from: &str, to: &str, now_ms: u64) -> Result<bool> {
        self.write(|s| {
            Ok(s.conn.execute(
                "UPDATE collabs SET state = ?3, updated_ms = ?4 WHERE id = ?1 AND state = ?2",
                params![id, from, to, now_ms as i64],
            )? == 1)
        })
    }

    fn put_collab_run(&mut self, r: &CollabRunRow) -> Result<()> {
        self.write(|s| {
            s.conn.execute(
                &format!("INSERT OR REPLACE INTO collab_runs ({RUN_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                params![r.collab, r.phase, r.run, r.task, r.state, r.reads,
                    r.started_ms as i64, r.ended_ms.map(|m| m as i64)],
            )?;
            Ok(())
        })
    }

    fn collab_runs(&self, collab: &str, limit: usize) -> Result<Vec<CollabRunRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {RUN_COLS} FROM collab_runs WHERE collab = ?1 ORDER BY phase, run LIMIT ?2"
        ))?;
        let rows = st.query_map(params![collab, limit as i64], run_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn insert_approval(&mut self, a: &ApprovalRow) -> Result<()> {
        self.write(|s| {
            s.conn.execute(
                &format!("INSERT INTO collab_approvals ({APPROVAL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                params![a.id, a.collab, a.phase, a.run, a.digest, a.input, a.state,
                    a.created_ms as i64, a.decided_ms.map(|m| m as i64), a.note],
            )?;
            Ok(())
        })
    }

    fn approval(&self, id: &str) -> Result<Option<ApprovalRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {APPROVAL_COLS} FROM collab_approvals WHERE id = ?1"
            ))?
            .query_row([id], approval_from_row)
            .optional()?)
    }

    fn approvals(&self, collab: &str, limit: usize) -> Result<Vec<ApprovalRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {APPROVAL_COLS} FROM collab_approvals WHERE collab = ?1
             ORDER BY created_ms, id LIMIT ?2"
        ))?;
        let rows = st.query_map(params![collab, limit as i64], approval_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn decide_approval(
        &mut self,
        id: &str,
        digest: &str,
        to: &str,
        now_ms: u64,
        note: Option<&str>,
    ) -> Result<bool> {
        self.write(|s| {
            Ok(s.conn.execute(
                "UPDATE collab_approvals SET state = ?3, decided_ms = ?4, note = ?5
                 WHERE id = ?1 AND digest = ?2 AND state = 'pending'",
                params![id, digest, to, now_ms as i64, note],
            )? == 1)
        })
    }

    fn hold(&self, id: &str) -> Result<Option<HoldRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {HOLD_COLS} FROM holds WHERE id = ?1"))?
            .query_row([id], hold_from_row)
            .optional()?)
    }

    fn resolve_hold(&mut self, id: &str, r: &HoldResolution<'_>) -> Result<bool> {
        self.write(|c| {
            let n = c.conn.execute(
                "UPDATE holds SET resolved_seq = ?2, resolved_ms = ?3, resolved_by = ?4,
                    outcome = ?5, evidence = ?6
                 WHERE id = ?1 AND resolved_seq IS NULL",
                params![
                    id,
                    r.seq as i64,
                    r.at_ms as i64,
                    r.by,
                    r.outcome,
                    r.evidence
                ],
            )?;
            Ok(n == 1)
        })
    }

    fn break_glass(&self) -> Result<bool> {
        Ok(self.load_meta_u64("break_glass")? == 1)
    }

    fn set_break_glass(&mut self, engaged: bool) -> Result<u64> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            tx.execute(
                "UPDATE meta SET value = ?1 WHERE key = 'break_glass'",
                [if engaged { "1" } else { "0" }],
            )?;
            tx.execute(
                "UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)
                 WHERE key = 'control_epoch'",
                [],
            )?;
            tx.commit()?;
            c.cache.epoch = c.load_control_epoch()?;
            // the engine's views carry the control epoch
            c.cache.view_gens.clear();
            Ok(c.cache.epoch)
        })
    }

    fn set_admission(&mut self, room: &str, seq: u64, open: bool) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "UPDATE rooms SET admission_gen = ?2, admission_open = ?3, revision = revision + 1
                 WHERE name = ?1 AND admission_gen < ?2",
                params![room, seq as i64, open],
            )?;
            c.reload_room(room)
        })
    }

    fn task(&self, id: &str) -> Result<Option<TaskRow>> {
        self.conn
            .prepare_cached(&format!("SELECT {TASK_COLS} FROM tasks WHERE id = ?1"))?
            .query_row([id], task_from_row)
            .optional()
            .map_err(task_err)
    }

    /// Tasks whose parent is `parent`.
    fn children(&self, parent: &str) -> Result<Vec<TaskRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE parent = ?1 ORDER BY id"
        ))?;
        let rows = st.query_map([parent], task_from_row)?;
        rows.collect::<rusqlite::Result<_>>().map_err(task_err)
    }

    /// Claimed tasks that name a scope, in one project (or, outside projects, one room): the
    /// live leases the `exclusive` invariant checks a new claim against.
    fn leased(&self, project: Option<&str>, room: &str) -> Result<Vec<TaskRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE lease_held = 1
               AND ((?1 IS NOT NULL AND project_id = ?1) OR (?1 IS NULL AND project_id IS NULL AND room = ?2))
             ORDER BY id"
        ))?;
        let rows = st.query_map(params![project, room], task_from_row)?;
        rows.collect::<rusqlite::Result<_>>().map_err(task_err)
    }

    fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "INSERT INTO tasks (id, room, project_id, title, owner, recipient, parent, status, created_ms, updated_ms, scopes, requirements, acceptance, coordination_only, governed, parent_revision, stage)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
                params![t.id, t.room, t.project_id, t.title, t.owner, t.recipient, t.parent, t.status.as_str(), t.created_ms as i64, t.updated_ms as i64,
                    serde_json::to_string(&t.scopes).expect("scopes serialize"),
                    serde_json::to_string(&t.requirements).expect("requirements serialize"),
                    serde_json::to_string(&t.acceptance).expect("checks serialize"),
                    t.coordination_only, t.governed, t.parent_revision.map(|r| r as i64),
                    serde_json::to_string(&t.stage).expect("selections serialize")],
            )?;
            let mut st = c.conn.prepare_cached(
                "INSERT OR IGNORE INTO task_scopes (task, namespace, resource) VALUES (?1, ?2, ?3)",
            )?;
            for s in &t.scopes {
                let (ns, res) = s.split_once(':').unwrap_or((s.as_str(), ""));
                st.execute(params![t.id, ns, res])?;
            }
            Ok(())
        })
    }

    fn leased_over(
        &self,
        project: Option<&str>,
        room: &str,
        over: &[room_core::scope::Scope],
    ) -> Result<Vec<TaskRow>> {
        // the holders of an exact scope, of a directory above a file scope, and of anything
        // under it: each an index lookup or range, never a walk over every lease
        let mut ids = std::collections::BTreeSet::new();
        let mut exact = self.conn.prepare_cached(
            "SELECT task FROM task_scopes WHERE namespace = ?1 AND resource = ?2",
        )?;
        let mut under = self.conn.prepare_cached(
            "SELECT task FROM task_scopes WHERE namespace = 'file' AND resource > ?1 AND resource < ?2",
        )?;
        for s in over {
            let mut keys = vec![s.resource.clone()];
            if s.namespace == "file" {
                let mut at = s.resource.as_str();
                while let Some((up, _)) = at.rsplit_once('/') {
                    keys.push(up.to_string());
                    at = up;
                }
                let rows = under.query_map(
                    params![format!("{}/", s.resource), format!("{}0", s.resource)],
                    |r| r.get::<_, String>(0),
                )?;
                for id in rows {
                    ids.insert(id?);
                }
            }
            for k in keys {
                for id in exact.query_map(params![s.namespace, k], |r| r.get::<_, String>(0))? {
                    ids.insert(id?);
                }
            }
        }
        let mut out = Vec::new();
        for id in ids {
            if let Some(t) = self.task(&id)?
                && t.lease_held
                && match project {
                    Some(p) => t.project_id.as_deref() == Some(p),
                    None => t.project_id.is_none() && t.room == room,
                }
            {
                out.push(t);
            }
        }
        Ok(out)
    }

    fn amend_task(&mut self, id: &str, terms: &room_core::event::TaskTerms) -> Result<bool> {
        self.write(|c| {
            let n = c.conn.execute(
                "UPDATE tasks SET requirements = ?2, acceptance = ?3, revision = ?4, override_reason = NULL
                 WHERE id = ?1 AND revision < ?4 AND status NOT IN ('done', 'declined', 'superseded', 'cancelled')",
                params![
                    id,
                    serde_json::to_string(&terms.requirements).expect("requirements serialize"),
                    serde_json::to_string(&terms.acceptance).expect("checks serialize"),
                    terms.revision as i64
                ],
            )?;
            Ok(n == 1)
        })
    }

    fn pin_claim(&mut self, id: &str, pin: &BTreeMap<String, String>) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "UPDATE tasks SET claim_pin = ?2 WHERE id = ?1",
                params![id, serde_json::to_string(pin).expect("pins serialize")],
            )?;
            Ok(())
        })
    }

    fn set_override(&mut self, id: &str, reason: &str) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "UPDATE tasks SET override_reason = ?2 WHERE id = ?1",
                params![id, reason],
            )?;
            Ok(())
        })
    }

    fn set_successor(&mut self, id: &str, successor: &str) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "UPDATE tasks SET successor = ?2 WHERE id = ?1",
                params![id, successor],
            )?;
            Ok(())
        })
    }

    fn move_stage_pin(&mut self, id: &str, path: &str, from: &str, to: &str) -> Result<bool> {
        self.write(|c| {
            let text: Option<String> = c
                .conn
                .prepare_cached("SELECT stage FROM tasks WHERE id = ?1")?
                .query_row([id], |r| r.get(0))
                .optional()?;
            let Some(text) = text else { return Ok(false) };
            let mut stage: Vec<room_core::stage::Selection> = serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("stage of task {id}: {e}")))?;
            let Some(sel) = stage
                .iter_mut()
                .find(|s| s.path == path && s.sha256 == from)
            else {
                return Ok(false);
            };
            sel.sha256 = to.to_string();
            let n = c.conn.execute(
                "UPDATE tasks SET stage = ?2 WHERE id = ?1 AND stage = ?3",
                params![
                    id,
                    serde_json::to_string(&stage).expect("selections serialize"),
                    text
                ],
            )?;
            Ok(n == 1)
        })
    }

    fn project_source(&self, project: &str) -> Result<Option<Vec<String>>> {
        let text: Option<String> = self
            .conn
            .prepare_cached("SELECT parts FROM project_sources WHERE project = ?1")?
            .query_row([project], |r| r.get(0))
            .optional()?;
        match text {
            Some(t) => Ok(Some(serde_json::from_str(&t).map_err(|e| {
                StoreError::Corrupt(format!("project_sources of {project}: {e}"))
            })?)),
            None => Ok(None),
        }
    }

    fn set_project_source(&mut self, project: &str, parts: Option<&[String]>) -> Result<()> {
        self.write(|c| {
            match parts {
                Some(p) => c.conn.execute(
                    "INSERT INTO project_sources (project, parts) VALUES (?1, ?2)
                     ON CONFLICT(project) DO UPDATE SET parts = ?2",
                    params![project, serde_json::to_string(p).expect("paths serialize")],
                )?,
                None => c
                    .conn
                    .execute("DELETE FROM project_sources WHERE project = ?1", [project])?,
            };
            Ok(())
        })
    }

    fn superseded_by(&self, successor: &str) -> Result<Vec<TaskRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE successor = ?1 ORDER BY id LIMIT 64"
        ))?;
        let rows = st.query_map([successor], task_from_row)?;
        rows.collect::<rusqlite::Result<_>>().map_err(task_err)
    }

    /// Compare-and-set a task's status and recipient: returns false when the task was not in
    /// `from_status` any more (a concurrent change won).
    fn update_task(
        &mut self,
        id: &str,
        from_status: &str,
        status: &str,
        recipient: Option<&str>,
        now_ms: u64,
        lease_gen: Option<u64>,
    ) -> Result<bool> {
        self.write(|c| {
            // a transition releases the task's lease unless it takes a new one (a claim)
            let n = c.conn.execute(
                // a scoped claim journaled before leases had generations (no ?6) still leases
                // its scopes, as migration 6 decided for the rows it found: a replay agrees
                "UPDATE tasks SET status = ?3, recipient = ?4, updated_ms = ?5,
                    lease_gen = CASE WHEN ?6 IS NOT NULL THEN ?6
                        WHEN ?3 = 'claimed' AND scopes != '[]' THEN COALESCE(lease_gen, 0)
                        ELSE lease_gen END,
                    lease_held = (?6 IS NOT NULL OR (?3 = 'claimed' AND scopes != '[]'))
                 WHERE id = ?1 AND status = ?2",
                params![
                    id,
                    from_status,
                    status,
                    recipient,
                    now_ms as i64,
                    lease_gen.map(|g| g as i64)
                ],
            )?;
            Ok(n == 1)
        })
    }

    fn release_lease(&mut self, id: &str, generation: u64) -> Result<bool> {
        self.write(|c| {
            let n = c.conn.execute(
                "UPDATE tasks SET lease_held = 0 WHERE id = ?1 AND lease_gen = ?2 AND lease_held = 1",
                params![id, generation as i64],
            )?;
            Ok(n == 1)
        })
    }

    fn lease_gen_max(&self) -> Result<u64> {
        // the rows' and the floor a rebuild left: generations issued before it stay issued
        let g: i64 = self.conn.query_row(
            "SELECT max(
                COALESCE((SELECT max(lease_gen) FROM tasks WHERE lease_gen IS NOT NULL), 0),
                COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'lease_gen_floor'), 0))",
            [],
            |r| r.get(0),
        )?;
        Ok(u(g))
    }

    fn clear_room_tasks(&mut self, room: &str) -> Result<u64> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            tx.execute(
                "DELETE FROM task_checks WHERE task IN (SELECT id FROM tasks WHERE room = ?1)",
                [room],
            )?;
            tx.execute(
                "DELETE FROM task_scopes WHERE task IN (SELECT id FROM tasks WHERE room = ?1)",
                [room],
            )?;
            // the fencing numbers these rows carried were handed out: the next is higher still,
            // whatever the rebuild restores (a restart forgets the engine's own high-water mark)
            tx.execute(
                "INSERT INTO meta (key, value)
                 SELECT 'lease_gen_floor', CAST(max(lease_gen) AS TEXT) FROM tasks
                 WHERE room = ?1 AND lease_gen IS NOT NULL HAVING max(lease_gen) IS NOT NULL
                 ON CONFLICT (key) DO UPDATE SET value =
                    CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)",
                [room],
            )?;
            let n = tx.execute("DELETE FROM tasks WHERE room = ?1", [room])?;
            tx.commit()?;
            Ok(n as u64)
        })
    }

    fn record_task_check(&mut self, row: &TaskCheckRow) -> Result<()> {
        self.write(|c| {
            c.conn.execute(
                "INSERT INTO task_checks (task, at_ms, pass, evaluation) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (task) DO UPDATE SET at_ms = ?2, pass = ?3, evaluation = ?4",
                params![row.task, row.at_ms as i64, row.pass, row.evaluation],
            )?;
            Ok(())
        })
    }

    fn task_check(&self, task: &str) -> Result<Option<TaskCheckRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT task, at_ms, pass, evaluation FROM task_checks WHERE task = ?1",
            )?
            .query_row([task], |r| {
                Ok(TaskCheckRow {
                    task: r.get(0)?,
                    at_ms: u(r.get(1)?),
                    pass: r.get(2)?,
                    evaluation: r.get(3)?,
                })
            })
            .optional()?)
    }

    /// Queue `rows` in one transaction. A permit already queued under the same key stays as it
    /// was sealed (re-derivation after a crash reproduces only what is missing).
    fn insert_wakes(&mut self, rows: &[WakeRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        self.write(|c| {
            let tx = c.conn.transaction()?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT OR IGNORE INTO wakes (room, agent, source_event, created_ms, permit)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                for w in rows {
                    st.execute(params![
                        w.room,
                        w.agent,
                        w.source_event,
                        w.created_ms as i64,
                        w.permit
                    ])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Every room must queue all its permits from the start of its journal (set by the
    /// migration that created the queue).
    fn wakes_requeue_pending(&self) -> Result<bool> {
        Ok(self
            .conn
            .query_row("SELECT 1 FROM meta WHERE key = 'wakes_requeue'", [], |_| {
                Ok(())
            })
            .optional()?
            .is_some())
    }

    fn wakes_requeue_done(&mut self) -> Result<()> {
        self.write(|c| {
            c.conn
                .execute("DELETE FROM meta WHERE key = 'wakes_requeue'", [])?;
            Ok(())
        })
    }

    /// Queued permits, oldest first, optionally of one room; at most [`WAKES_PAGE_MAX`].
    fn room_witnesses(&self, room: &str) -> Result<RoomWitnesses> {
        room_witnesses_of(&self.conn, room)
    }

    fn wakes(&self, room: Option<&str>) -> Result<Vec<WakeRow>> {
        // two statements, so each can use its index (a room's rows, or all by creation)
        let mut st = self.conn.prepare_cached(if room.is_some() {
            "SELECT room, agent, source_event, created_ms, permit, state, reason, detail FROM wakes
             WHERE room = ?1 ORDER BY created_ms, agent, source_event LIMIT ?2"
        } else {
            "SELECT room, agent, source_event, created_ms, permit, state, reason, detail FROM wakes
             WHERE ?1 IS NULL ORDER BY created_ms, room, agent, source_event LIMIT ?2"
        })?;
        let rows = st.query_map(params![room, WAKES_PAGE_MAX as i64], wake_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn wakes_to_check(&self, limit: usize) -> Result<Vec<WakeRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT room, agent, source_event, created_ms, permit, state, reason, detail FROM wakes
             WHERE state = 'queued' ORDER BY checked_ms, created_ms LIMIT ?1",
        )?;
        let rows = st.query_map([limit as i64], wake_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn wakes_checked(&mut self, checked: &[WakeVerdict], at_ms: u64) -> Result<Vec<bool>> {
        if checked.is_empty() {
            return Ok(Vec::new());
        }
        self.write(|c| {
            let tx = c.conn.transaction()?;
            let mut moved = Vec::with_capacity(checked.len());
            {
                let mut st = tx.prepare_cached(
                    "UPDATE wakes SET checked_ms = ?4,
                        state = CASE WHEN ?5 IS NULL THEN state ELSE 'dead' END,
                        reason = COALESCE(?5, reason), detail = COALESCE(?6, detail)
                     WHERE room = ?1 AND agent = ?2 AND source_event = ?3 AND state = 'queued'",
                )?;
                for v in checked {
                    let w = &v.wake;
                    let n = st.execute(params![
                        w.room,
                        w.agent,
                        w.source_event,
                        at_ms as i64,
                        v.dead.as_ref().map(|d| d.0.as_str()),
                        v.dead.as_ref().map(|d| d.1.as_str())
                    ])?;
                    moved.push(n == 1);
                }
            }
            tx.commit()?;
            Ok(moved)
        })
    }

    fn wake(&self, room: &str, agent: &str, source_event: &str) -> Result<Option<WakeRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT room, agent, source_event, created_ms, permit, state, reason, detail FROM wakes
                 WHERE room = ?1 AND agent = ?2 AND source_event = ?3",
            )?
            .query_row(params![room, agent, source_event], wake_from_row)
            .optional()?)
    }

    fn wakes_queued_of(&self, agents: &[String], limit: usize) -> Result<Vec<WakeRow>> {
        let mut out = Vec::new();
        let mut st = self.conn.prepare_cached(
            "SELECT room, agent, source_event, created_ms, permit, state, reason, detail FROM wakes
             WHERE state = 'queued' AND agent = ?1 ORDER BY created_ms LIMIT ?2",
        )?;
        for a in agents {
            let rows = st.query_map(params![a, limit as i64], wake_from_row)?;
            for r in rows {
                out.push(r?);
            }
        }
        out.sort_by_key(|w| w.created_ms);
        out.truncate(limit);
        Ok(out)
    }

    fn insert_launch(&mut self, l: &LaunchRow) -> Result<bool> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            let n = tx.execute(
                "UPDATE wakes SET state = 'dispatched' WHERE room = ?1 AND agent = ?2
                   AND source_event = ?3 AND state = 'queued'",
                params![l.room, l.agent, l.source_event],
            )?;
            if n != 1 {
                // taken or dead-lettered meanwhile: nothing is written
                return Ok(false);
            }
            tx.execute(
                &format!("INSERT INTO launches ({LAUNCH_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)"),
                params![l.id, l.room, l.agent, l.source_event, l.secret_sha256, l.permit_sha256,
                    l.state, l.pid.map(i64::from), l.created_ms as i64, l.not_after_ms as i64,
                    l.ended_ms.map(|v| v as i64), l.outcome, l.proof, l.detail, l.delivery,
                    l.started_ms.map(|v| v as i64), l.control_epoch as i64, l.cancel_gen as i64,
                    l.conversation, l.severed],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    fn launch(&self, id: &str) -> Result<Option<LaunchRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {LAUNCH_COLS} FROM launches WHERE id = ?1"))?
            .query_row([id], launch_from_row)
            .optional()?)
    }

    fn launch_by_secret(&self, secret_sha256: &str) -> Result<Option<LaunchRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {LAUNCH_COLS} FROM launches WHERE secret_sha256 = ?1"
            ))?
            .query_row([secret_sha256], launch_from_row)
            .optional()?)
    }

    fn launches_of(&self, agent: &str, limit: usize) -> Result<Vec<LaunchRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {LAUNCH_COLS} FROM launches WHERE agent = ?1 ORDER BY created_ms DESC, id LIMIT ?2"
        ))?;
        let rows = st.query_map(params![agent, limit as i64], launch_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn launches_of_wake(
        &self,
        room: &str,
        agent: &str,
        source_event: &str,
    ) -> Result<Vec<LaunchRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {LAUNCH_COLS} FROM launches WHERE room = ?1 AND agent = ?2 AND source_event = ?3
             ORDER BY created_ms, id LIMIT {LAUNCHES_OF_WAKE_MAX}"
        ))?;
        let rows = st.query_map(params![room, agent, source_event], launch_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn launches_live(&self) -> Result<Vec<LaunchRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {LAUNCH_COLS} FROM launches WHERE state != 'ended' ORDER BY created_ms"
        ))?;
        let rows = st.query_map([], launch_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn launch_running(&mut self, id: &str, pid: Option<u32>, at_ms: u64) -> Result<bool> {
        self.write(|c| {
            let n = c.conn.execute(
                "UPDATE launches SET state = 'running', pid = ?2, started_ms = ?3
                 WHERE id = ?1 AND state = 'starting'",
                params![id, pid.map(i64::from), at_ms as i64],
            )?;
            Ok(n == 1)
        })
    }

    fn launch_severed(&mut self, id: &str, detail: &str) -> Result<bool> {
        self.write(|c| {
            let n = c.conn.execute(
                "UPDATE launches SET severed = ?2 WHERE id = ?1 AND severed IS NULL",
                params![id, detail],
            )?;
            Ok(n == 1)
        })
    }

    fn launch_unconfirmed(&mut self, id: &str, detail: &str) -> Result<bool> {
        self.write(|c| {
            let n = c.conn.execute(
                "UPDATE launches SET state = 'unconfirmed', detail = ?2
                 WHERE id = ?1 AND state IN ('starting', 'running')",
                params![id, detail],
            )?;
            Ok(n == 1)
        })
    }

    fn launch_ended(&mut self, id: &str, end: &LaunchEnd) -> Result<bool> {
        self.write(|c| {
            let tx = c.conn.transaction()?;
            let n = tx.execute(
                "UPDATE launches SET state = 'ended', ended_ms = ?2, outcome = ?3, proof = ?4,
                   detail = ?5 WHERE id = ?1 AND state != 'ended'",
                params![id, end.at_ms as i64, end.outcome, end.proof, end.detail],
            )?;
            if n == 1 {
                // a dead letter keeps the reason it died of (a cancel's, say)
                tx.execute(
                    "UPDATE wakes SET state = ?2, reason = ?3 WHERE (room, agent, source_event) =
                       (SELECT room, agent, source_event FROM launches WHERE id = ?1)
                       AND state != 'dead'",
                    params![id, end.wake_state, end.outcome],
                )?;
                if let Some(s) = &end.session {
                    record_session(&tx, s)?;
                }
            }
            tx.commit()?;
            Ok(n == 1)
        })
    }

    fn sessions(&self, agent: Option<&str>, limit: usize) -> Result<Vec<SessionRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE ?1 IS NULL OR agent = ?1
             ORDER BY updated_ms DESC, id LIMIT ?2"
        ))?;
        let rows = st.query_map(
            params![agent, limit.min(SESSIONS_PAGE_MAX) as i64],
            session_from_row,
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn session(&self, id: &str) -> Result<Option<SessionRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE id = ?1"
            ))?
            .query_row([id], session_from_row)
            .optional()?)
    }

    fn session_bound(&self, agent: &str) -> Result<Option<SessionRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE agent = ?1 AND bound = 1"
            ))?
            .query_row([agent], session_from_row)
            .optional()?)
    }

    /// An earlier reload failed: the cache must be reloaded before it is trusted.
    fn is_stale(&self) -> bool {
        self.stale
    }

    /// Reload the cache if an earlier reload failed (see `stale`).
    fn refresh_if_stale(&mut self) {
        if !self.stale {
            return;
        }
        match self.load_cache() {
            Ok(()) => self.stale = false,
            Err(e) => tracing::error!("control.db cache reload failed (retried on next use): {e}"),
        }
    }
}

/// Every write to control.db passes here. A write that fails may have been rolled back by
/// SQLite, or committed but not confirmed by fsync: the cache is then filled anew from what the
/// database says, so no decision rests on a row that is not there.
impl SqliteControl {
    fn write<T>(&mut self, f: impl FnOnce(&mut SqliteControl) -> Result<T>) -> Result<T> {
        self.writes += 1;
        let out = f(self);
        if out.is_err() {
            self.stale = true;
            self.refresh_if_stale();
        }
        out
    }
}
