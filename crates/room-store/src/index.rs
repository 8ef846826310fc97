//! The per-room sync index (`sync_index.db`): the rebuildable projection of the journal (events,
//! causal edges, mentions, obligations) plus receipts and checkpoints, which only it holds and
//! which survive a rebuild. Every connection sets and reads back its pragmas and refuses to run
//! if any differs: an index that silently runs without WAL or full sync would acknowledge
//! checkpoints that a power cut can take back.

use crate::backend::{ChangeStamp, RoomIndex};
use crate::journal::{ChainPos, JournalMark};
use crate::{Result, StoreError};
use room_core::event::SeqWitness;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Ordered migrations; `user_version` is the number applied.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE events (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    hlc_ms INTEGER NOT NULL,
    hlc_c INTEGER NOT NULL,
    hash TEXT NOT NULL,
    task TEXT,
    body TEXT NOT NULL
) STRICT;
CREATE INDEX events_task ON events(task) WHERE task IS NOT NULL;
CREATE TABLE causal_edges (
    child TEXT NOT NULL REFERENCES events(id) ON DELETE CASCADE,
    parent TEXT NOT NULL,
    PRIMARY KEY (child, parent)
) STRICT, WITHOUT ROWID;
CREATE TABLE mentions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL REFERENCES events(id) ON DELETE CASCADE,
    source_seq INTEGER NOT NULL,
    agent TEXT NOT NULL,
    from_agent TEXT NOT NULL,
    task TEXT,
    status TEXT NOT NULL,
    resolved_by TEXT,
    not_after_ms INTEGER
) STRICT;
CREATE INDEX mentions_open ON mentions(agent, status);
CREATE TABLE obligations (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL REFERENCES events(id) ON DELETE CASCADE,
    source_seq INTEGER NOT NULL,
    agent TEXT NOT NULL,
    from_agent TEXT NOT NULL,
    task TEXT,
    status TEXT NOT NULL,
    resolved_by TEXT,
    not_after_ms INTEGER
) STRICT;
CREATE INDEX obligations_open ON obligations(agent, status);
CREATE TABLE checkpoints (
    actor TEXT NOT NULL,
    conversation TEXT NOT NULL,
    conversation_key TEXT NOT NULL,
    view_gen TEXT NOT NULL,
    confirmed_seq INTEGER NOT NULL,
    chunk_seq INTEGER,
    chunk_offset INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (actor, conversation)
) STRICT;
CREATE TABLE receipts (
    id TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    conversation TEXT NOT NULL,
    conversation_key TEXT NOT NULL,
    view_gen TEXT NOT NULL,
    from_seq INTEGER NOT NULL,
    from_offset INTEGER NOT NULL,
    to_seq INTEGER NOT NULL,
    chunk_seq INTEGER,
    chunk_offset INTEGER NOT NULL,
    tip_seq INTEGER NOT NULL,
    tip_hash TEXT NOT NULL,
    delivered_sha256 TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    confirmed_ms INTEGER
) STRICT;
"#,
    r#"
CREATE TABLE idempotency (
    actor TEXT NOT NULL,
    key TEXT NOT NULL,
    event TEXT NOT NULL,
    seq INTEGER NOT NULL,
    task TEXT,
    PRIMARY KEY (actor, key)
) STRICT;
CREATE INDEX idempotency_seq ON idempotency(seq);
CREATE TABLE lifecycles (
    agent TEXT NOT NULL,
    task TEXT NOT NULL,
    state TEXT NOT NULL,
    began_seq INTEGER NOT NULL,
    began_ms INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL,
    lapsed INTEGER NOT NULL,
    PRIMARY KEY (agent, task)
) STRICT;
CREATE INDEX lifecycles_begun ON lifecycles(state, lapsed);
-- the new tables are projections of records already in the journal: replay it at the next open
DELETE FROM meta WHERE key = 'journal_mark';
"#,
    r#"
DROP INDEX mentions_open;
DROP INDEX obligations_open;
CREATE INDEX mentions_open ON mentions(agent, status, source_seq);
CREATE INDEX obligations_open ON obligations(agent, status, source_seq);
"#,
    r#"
CREATE INDEX mentions_task_open ON mentions(agent, task) WHERE status = 'open' AND task IS NOT NULL;
CREATE INDEX obligations_task_open ON obligations(agent, task) WHERE status = 'open' AND task IS NOT NULL;
"#,
    // Open items per addressee, kept by triggers in the same transaction as the items, so that a
    // sync page's total costs one read however many items are open.
    r#"
CREATE TABLE open_counts (
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (agent, kind)
) STRICT, WITHOUT ROWID;
INSERT INTO open_counts (agent, kind, n)
    SELECT agent, 'mention', count(*) FROM mentions WHERE status = 'open' GROUP BY agent;
INSERT INTO open_counts (agent, kind, n)
    SELECT agent, 'obligation', count(*) FROM obligations WHERE status = 'open' GROUP BY agent;
CREATE TRIGGER mentions_opened AFTER INSERT ON mentions WHEN NEW.status = 'open' BEGIN
    INSERT INTO open_counts (agent, kind, n) VALUES (NEW.agent, 'mention', 1)
        ON CONFLICT (agent, kind) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER mentions_closed AFTER UPDATE OF status ON mentions
    WHEN OLD.status = 'open' AND NEW.status != 'open' BEGIN
    UPDATE open_counts SET n = n - 1 WHERE agent = OLD.agent AND kind = 'mention';
END;
CREATE TRIGGER mentions_deleted AFTER DELETE ON mentions WHEN OLD.status = 'open' BEGIN
    UPDATE open_counts SET n = n - 1 WHERE agent = OLD.agent AND kind = 'mention';
END;
CREATE TRIGGER obligations_opened AFTER INSERT ON obligations WHEN NEW.status = 'open' BEGIN
    INSERT INTO open_counts (agent, kind, n) VALUES (NEW.agent, 'obligation', 1)
        ON CONFLICT (agent, kind) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER obligations_closed AFTER UPDATE OF status ON obligations
    WHEN OLD.status = 'open' AND NEW.status != 'open' BEGIN
    UPDATE open_counts SET n = n - 1 WHERE agent = OLD.agent AND kind = 'obligation';
END;
CREATE TRIGGER obligations_deleted AFTER DELETE ON obligations WHEN OLD.status = 'open' BEGIN
    UPDATE open_counts SET n = n - 1 WHERE agent = OLD.agent AND kind = 'obligation';
END;
"#,
    // The destination ledger: external operations, Begin -> Effect -> Resolve.
    r#"
CREATE TABLE ops (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    task TEXT NOT NULL,
    destination TEXT,
    parent TEXT,
    state TEXT NOT NULL,
    outcome TEXT,
    probe TEXT,
    began_seq INTEGER NOT NULL,
    began_ms INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL,
    lapsed INTEGER NOT NULL
) STRICT;
CREATE INDEX ops_task ON ops(task);
CREATE INDEX ops_unresolved ON ops(state, lapsed) WHERE state != 'resolved';
"#,
    // Evidence handles: first-hand origins and lineage, per task requirement.
    r#"
CREATE TABLE evidence (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    task TEXT,
    req TEXT,
    origin TEXT,
    lineage TEXT NOT NULL,
    event TEXT NOT NULL,
    seq INTEGER NOT NULL
) STRICT;
CREATE INDEX evidence_task_req ON evidence(task, req) WHERE task IS NOT NULL;
"#,
    // Governing-source reading receipts: what each reader was served (not a projection of the
    // journal: a rebuild keeps them, and losing one fails closed, the reader reads again).
    r#"
CREATE TABLE source_reads (
    agent TEXT NOT NULL,
    conversation TEXT NOT NULL,
    task TEXT NOT NULL,
    path TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    from_byte INTEGER NOT NULL,
    to_byte INTEGER NOT NULL,
    at_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX source_reads_reader ON source_reads(agent, task, path, conversation);
"#,
    // Evidence of a file origin carries the file's digest as Room measured it at registration.
    r#"
ALTER TABLE evidence ADD COLUMN sha256 TEXT;
CREATE INDEX evidence_task ON evidence(task, seq) WHERE task IS NOT NULL;
"#,
    // The obligation fold lists a room's open obligations, whoever they are addressed to.
    r#"
CREATE INDEX obligations_open_all ON obligations(source_seq) WHERE status = 'open';
"#,
    // A delta page continues the page whose receipt its reader presented (`read_through`): its
    // receipt names that one, and confirming it confirms the chain.
    r#"
ALTER TABLE receipts ADD COLUMN base TEXT;
"#,
    // A page served under a transport's lower ceiling is re-rendered under that ceiling when it
    // is confirmed (the ceiling decides which events arrive whole and which in fragments).
    r#"
ALTER TABLE receipts ADD COLUMN page_bytes INTEGER;
"#,
    // A worker receipt asks which later turns cite a proposal's record.
    r#"
CREATE INDEX causal_edges_parent ON causal_edges(parent);
"#,
    // Page items no longer carry what their envelope repeats nor the Fold Rule's bookkeeping,
    // so an event now renders shorter than the rendering a reader may have stopped inside:
    // such a reader takes that event again from its first byte, never the old rendering's
    // start joined to the new one's end (its checkpoint's seq, which the gate reads, stays).
    r#"
UPDATE checkpoints SET chunk_seq = NULL, chunk_offset = 0 WHERE chunk_offset > 0;
"#,
    // An event's audience, taken from its body once when it is projected: a page and the gate
    // read it for every event they pass, and finding it in the body each time cost a busy
    // room a tenth of its time. NULL: the body names none (every reader of the room).
    r#"
ALTER TABLE events ADD COLUMN audience TEXT;
UPDATE events SET audience = json_extract(body, '$.audience') WHERE instr(body, '"audience"') > 0;
"#,
    // The blackboard: one row per artifact version, projected from the turn that wrote it
    // (its content is a blob; the row is the index entry a reader looks up).
    r#"
CREATE TABLE artifacts (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    version INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    producer TEXT NOT NULL,
    parents TEXT NOT NULL,
    event TEXT NOT NULL,
    seq INTEGER NOT NULL,
    hlc_ms INTEGER NOT NULL,
    audience TEXT NOT NULL,
    task TEXT,
    PRIMARY KEY (kind, key, version)
) STRICT;
CREATE INDEX artifacts_task ON artifacts(task, kind, key) WHERE task IS NOT NULL;
"#,
    // Full-text search over what events say (a turn's text, a task's title), keyed by seq; the
    // table keeps only the index (contentless): the text stays in the events' bodies. Events
    // already projected are indexed once here; later ones as they are projected.
    r#"
CREATE VIRTUAL TABLE events_fts USING fts5(text, content='', tokenize='unicode61');
INSERT INTO events_fts(rowid, text)
    SELECT seq, t FROM (SELECT seq, COALESCE(json_extract(body, '$.text'),
        json_extract(body, '$.text_blob.preview'), json_extract(body, '$.created.title')) AS t
        FROM events) WHERE t IS NOT NULL;
"#,
    // Semantic search: one vector per event and embedding model, computed by the daemon away
    // from any write from the event's redacted text (unit length, each component scaled to
    // an i8), kept with the record's hash: a rebuild keeps them, and a vector counts only for
    // the record it was made from (a seq a cut journal gives again is another record).
    r#"
CREATE TABLE embeddings (
    seq INTEGER NOT NULL,
    model TEXT NOT NULL,
    hash TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (model, seq)
) STRICT, WITHOUT ROWID;
"#,
];

/// What of an event's body is searched: its text, a spilled text's preview, a task's title.
const FTS_TEXT: &str = "COALESCE(json_extract(?2, '$.text'), json_extract(?2, '$.text_blob.preview'), json_extract(?2, '$.created.title'))";

/// Reading receipts kept per reader, task and part (the oldest go first).
pub const SOURCE_READS_PER_PART_MAX: usize = 4096;

/// One served range of a governing-source part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceReadRow {
    pub agent: String,
    pub conversation: String,
    pub task: String,
    pub path: String,
    pub sha256: String,
    pub from_byte: u64,
    pub to_byte: u64,
    pub at_ms: u64,
}

/// The `exactly_once` registry's retention: the newest this many keys of a room are kept and
/// older ones are evicted first-in first-out. An evicted key no longer gets duplicate
/// protection; eviction grants nothing new.
pub const IDEMPOTENCY_KEYS_MAX: u64 = 10_000;

/// Tables that `room index rebuild` clears and refills from the journal.
const PROJECTION_TABLES: &[&str] = &[
    "mentions",
    "obligations",
    "open_counts",
    "causal_edges",
    "idempotency",
    "lifecycles",
    "ops",
    "evidence",
    "artifacts",
    "events",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub seq: u64,
    pub id: String,
    pub kind: String,
    pub actor: String,
    pub hlc_ms: u64,
    pub hlc_c: u32,
    pub hash: String,
    pub task: Option<String>,
    /// Canonical JSON of the record's `event`.
    pub body: String,
}

/// What names one event's rendering: its place, id and record hash (a page whose items are
/// already rendered reads only these, not the bodies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventHead {
    pub seq: u64,
    pub id: String,
    pub hash: String,
    /// The record's `audience` (empty: every reader of the room), so that a page can pass over
    /// what is withheld from its reader without reading the body.
    pub audience: Vec<String>,
}

/// The item kinds are the journal's (`room_core::event::ItemKind`); each has its own table.
pub use room_core::event::ItemKind;

trait Table {
    fn table(self) -> &'static str;
}

impl Table for ItemKind {
    fn table(self) -> &'static str {
        match self {
            ItemKind::Mention => "mentions",
            ItemKind::Obligation => "obligations",
        }
    }
}

/// A mention or obligation addressed to `agent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRow {
    pub kind: ItemKind,
    pub id: String,
    pub source: String,
    pub source_seq: u64,
    pub agent: String,
    pub from_agent: String,
    pub task: Option<String>,
    pub status: String,
    pub resolved_by: Option<String>,
    pub not_after_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    pub actor: String,
    pub conversation: String,
    pub conversation_key: String,
    pub view_gen: String,
    pub confirmed_seq: u64,
    /// A partly read oversized event: its seq and the byte offset confirmed so far.
    pub chunk_seq: Option<u64>,
    pub chunk_offset: u64,
    pub updated_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptRow {
    pub id: String,
    pub actor: String,
    pub conversation: String,
    pub conversation_key: String,
    pub view_gen: String,
    pub from_seq: u64,
    /// Byte offset inside event `from_seq` where the page started (0: at its start).
    pub from_offset: u64,
    /// The confirmed position this receipt establishes.
    pub to_seq: u64,
    pub chunk_seq: Option<u64>,
    pub chunk_offset: u64,
    pub tip_seq: u64,
    pub tip_hash: String,
    pub delivered_sha256: String,
    pub created_ms: u64,
    pub confirmed_ms: Option<u64>,
    /// The receipt whose page this one continues (a delta page served on a refusal): this page
    /// starts where that one ended, and confirming this one confirms both.
    pub base: Option<String>,
    /// The page ceiling it was served under, when not the engine's own.
    pub page_bytes: Option<u64>,
}

/// The Fold Rule, re-derived from the journal: a turn that landed proves its author had read
/// every foreign event before it, so the author's checkpoint for that conversation and view
/// may stand at the turn. Applied only to an existing row, only forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoldAdvance {
    pub actor: String,
    pub conversation_key: String,
    pub view_gen: String,
    pub seq: u64,
}

/// What one journal batch changes in the projection, applied in one transaction together with
/// the journal mark it brings the index up to.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub events: Vec<EventRow>,
    pub edges: Vec<(String, String)>,
    pub items: Vec<ItemRow>,
    /// (kind, item id, new status, resolving event id)
    pub resolutions: Vec<(ItemKind, String, String, String)>,
    pub checkpoints: Vec<CheckpointRow>,
    /// Checkpoints moved forward over landed turns (after `checkpoints`).
    pub folds: Vec<FoldAdvance>,
    /// `exactly_once`: (actor, key, event id, seq, task) registered by a committed record.
    pub idempotency: Vec<(String, String, String, u64, Option<String>)>,
    /// `well_formed` and `resolution`: lifecycle changes, applied in order.
    pub lifecycles: Vec<LifecycleChange>,
    /// The destination ledger's changes, applied in order.
    pub ops: Vec<OpChange>,
    /// Evidence registered.
    pub evidence: Vec<EvidenceRow>,
    /// Blackboard versions written.
    pub artifacts: Vec<ArtifactRow>,
    pub mark: Option<JournalMark>,
}

/// How far a room's journal is known good, and whether its last holder closed it in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogTrust {
    /// The chain up to here was read back from the file and verified from its first record.
    pub verified: Option<ChainPos>,
    /// The last holder closed the room in order (flushed, nothing in doubt). Cleared durably at
    /// open, before anything is appended.
    pub closed_clean: bool,
}

/// What a room's index says was acknowledged, and which losses its journal records as
/// accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexWitnesses {
    /// The highest seq each witness names (`index_tip`: the mark; `events`, `receipts`,
    /// `checkpoints`, `wakes_mark`); a witness that names none is left out.
    pub seqs: Vec<SeqWitness>,
    /// `(missing_from, missing_to)` of every `journal_loss` event at or below the seq asked
    /// about: ranges the owner accepted as lost, whose old witnesses no longer count.
    pub accepted: Vec<(u64, u64)>,
}

impl IndexWitnesses {
    /// The acknowledged seqs past `tip` that no accepted loss covers: `(first, last)`.
    pub fn missing_after(&self, tip: u64, more: &[SeqWitness]) -> Option<(u64, u64)> {
        let excused = |w: u64| self.accepted.iter().any(|&(a, b)| a <= w && w <= b);
        let last = self
            .seqs
            .iter()
            .chain(more)
            .map(|w| w.seq)
            .filter(|&w| w > tip && !excused(w))
            .max()?;
        Some((tip + 1, last))
    }
}

/// Read a sync index's witnesses of acknowledged seqs (see `IndexWitnesses`); `upto`: only
/// `journal_loss` events at or below it count as accepted.
/// `pending` is a mark not yet written (see `Index::pending_mark`): it stands for the stored one.
fn witnesses_of(
    conn: &Connection,
    upto: u64,
    pending: Option<&JournalMark>,
) -> Result<IndexWitnesses> {
    let mut seqs = Vec::new();
    let stored: Option<String> = match pending {
        Some(_) => None,
        None => conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'journal_mark'",
                [],
                |r| r.get(0),
            )
            .optional()?,
    };
    let stored = stored
        .map(|m| {
            serde_json::from_str::<JournalMark>(&m)
                .map_err(|e| StoreError::Corrupt(format!("journal mark: {e}")))
        })
        .transpose()?;
    if let Some(m) = pending.or(stored.as_ref()) {
        seqs.push(SeqWitness {
            source: "index_tip".into(),
            seq: m.tip_seq,
        });
    }
    for (source, sql) in [
        ("events", "SELECT max(seq) FROM events"),
        ("receipts", "SELECT max(tip_seq) FROM receipts"),
        ("checkpoints", "SELECT max(confirmed_seq) FROM checkpoints"),
        (
            "wakes_mark",
            "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'wakes_mark'",
        ),
    ] {
        let v: Option<i64> = conn.query_row(sql, [], |r| r.get(0)).optional()?.flatten();
        if let Some(v) = v.filter(|&v| v > 0) {
            seqs.push(SeqWitness {
                source: source.into(),
                seq: v as u64,
            });
        }
    }
    let mut accepted = Vec::new();
    let mut st =
        conn.prepare("SELECT body FROM events WHERE kind = 'journal_loss' AND seq <= ?1")?;
    for body in st.query_map([upto as i64], |r| r.get::<_, String>(0))? {
        let v: serde_json::Value = serde_json::from_str(&body?)
            .map_err(|e| StoreError::Corrupt(format!("journal_loss event: {e}")))?;
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        accepted.push((n("missing_from"), n("missing_to")));
    }
    Ok(IndexWitnesses { seqs, accepted })
}

/// Read a sync index's witnesses without changing it: opened read-only, no pragma set, no
/// migration run (`room verify`, which works without the daemon). Fails at once when a daemon
/// holds the index (it locks it exclusively).
pub fn read_witnesses(path: &Path, upto: u64) -> Result<IndexWitnesses> {
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
    witnesses_of(&conn, upto, None)
}

/// A change to one (agent, task) lifecycle: Begin → (Effect…) → Resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleChange {
    Begin {
        agent: String,
        task: String,
        seq: u64,
        at_ms: u64,
        ttl_ms: u64,
    },
    /// Every begun lifecycle of the task is resolved (a task has at most one claimer).
    Resolve { task: String },
    /// The begin outlived its TTL unresolved and was recorded as in doubt.
    Lapsed { agent: String, task: String },
}

/// One registered piece of evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceRow {
    pub id: String,
    pub agent: String,
    pub task: Option<String>,
    pub req: Option<String>,
    /// First-hand: where it comes from. Derived evidence has none of its own.
    pub origin: Option<String>,
    /// The evidence it derives from.
    pub lineage: Vec<String>,
    /// The registration's event id.
    pub event: String,
    pub seq: u64,
    /// A `file:` origin's digest when it was registered (Room measured it).
    pub sha256: Option<String>,
}

const EVIDENCE_COLS: &str = "id, agent, task, req, origin, lineage, event, seq, sha256";

fn evidence_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EvidenceRow> {
    let lineage: String = r.get(5)?;
    Ok(EvidenceRow {
        id: r.get(0)?,
        agent: r.get(1)?,
        task: r.get(2)?,
        req: r.get(3)?,
        origin: r.get(4)?,
        lineage: serde_json::from_str(&lineage).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, Box::new(e))
        })?,
        event: r.get(6)?,
        seq: r.get::<_, i64>(7)? as u64,
        sha256: r.get(8)?,
    })
}

/// One version of a blackboard artifact: the index entry of the turn that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRow {
    pub kind: String,
    pub key: String,
    pub version: u32,
    pub sha256: String,
    pub bytes: u64,
    pub producer: String,
    /// The events (artifact versions and others) it was made from.
    pub parents: Vec<String>,
    /// The turn that wrote it.
    pub event: String,
    pub seq: u64,
    pub hlc_ms: u64,
    /// Who may read it (empty: every reader of the room), as its turn says.
    pub audience: Vec<String>,
    /// The task its turn was written for (a phase run).
    pub task: Option<String>,
}

const ARTIFACT_COLS: &str =
    "kind, key, version, sha256, bytes, producer, parents, event, seq, hlc_ms, audience, task";

fn json_list(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Vec<String>> {
    let text: String = r.get(i)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn artifact_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ArtifactRow> {
    Ok(ArtifactRow {
        kind: r.get(0)?,
        key: r.get(1)?,
        version: r.get::<_, i64>(2)? as u32,
        sha256: r.get(3)?,
        bytes: r.get::<_, i64>(4)? as u64,
        producer: r.get(5)?,
        parents: json_list(r, 6)?,
        event: r.get(7)?,
        seq: r.get::<_, i64>(8)? as u64,
        hlc_ms: r.get::<_, i64>(9)? as u64,
        audience: json_list(r, 10)?,
        task: r.get(11)?,
    })
}

/// A change to one recorded external operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpChange {
    Begin(OpRow),
    Effect {
        id: String,
    },
    Resolve {
        id: String,
        outcome: String,
    },
    /// Unresolved past its TTL, recorded in doubt.
    Lapsed {
        id: String,
    },
}

/// One external operation as the ledger folds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRow {
    pub id: String,
    pub agent: String,
    pub task: String,
    pub destination: Option<String>,
    pub parent: Option<String>,
    /// `begun`, `effected` or `resolved`.
    pub state: String,
    /// `succeeded` or `failed` once resolved.
    pub outcome: Option<String>,
    /// The probe (JSON) that observes the effect, if the agent declared one.
    pub probe: Option<String>,
    pub began_seq: u64,
    pub began_ms: u64,
    pub ttl_ms: u64,
    pub lapsed: bool,
}

impl OpRow {
    /// The folded status: `in_doubt` once lapsed unresolved, else the state.
    pub fn status(&self) -> &str {
        if self.lapsed && self.state != "resolved" {
            "in_doubt"
        } else {
            &self.state
        }
    }
}

const OP_COLS: &str = "id, agent, task, destination, parent, state, outcome, probe, began_seq, began_ms, ttl_ms, lapsed";

fn op_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<OpRow> {
    Ok(OpRow {
        id: r.get(0)?,
        agent: r.get(1)?,
        task: r.get(2)?,
        destination: r.get(3)?,
        parent: r.get(4)?,
        state: r.get(5)?,
        outcome: r.get(6)?,
        probe: r.get(7)?,
        began_seq: r.get::<_, i64>(8)? as u64,
        began_ms: r.get::<_, i64>(9)? as u64,
        ttl_ms: r.get::<_, i64>(10)? as u64,
        lapsed: r.get::<_, i64>(11)? != 0,
    })
}

/// One (agent, task) lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleRow {
    pub agent: String,
    pub task: String,
    /// `begun` or `resolved`.
    pub state: String,
    pub began_seq: u64,
    pub began_ms: u64,
    pub ttl_ms: u64,
    pub lapsed: bool,
}

/// Projection batches held in one open transaction before it commits. The journal is the
/// commit point, so these rows are never the only copy: a crash loses them and the next open
/// re-projects them from the journal. Receipts and checkpoints commit at once.
pub const DEFERRED_BATCHES_MAX: usize = 64;

pub struct Index {
    conn: Connection,
    in_txn: bool,
    /// The connection's synchronous mode is FULL (else NORMAL): see `durable`.
    sync_full: bool,
    /// Commits since the last checkpoint, and how many are due between two.
    commits: u32,
    checkpoint_commits: u32,
    pending: usize,
    /// The journal mark of the last batch applied in the open transaction, written when it
    /// commits (`write_pending_mark`); reads of the mark on this connection see it first.
    pending_mark: Option<JournalMark>,
    /// Set when pending projection rows were rolled back: the index is then behind a mark it
    /// may already have written, and must not be read or written until a restart catches up.
    broken: Option<String>,
    receipts_kept_max: u64,
    /// Writes through this handle, for the change stamp.
    writes: u64,
}

impl Drop for Index {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!("index flush at close failed (the journal catches it up): {e}");
        }
    }
}

/// Prepared statements each daemon connection keeps (more than it has distinct statements).
pub const STATEMENTS_CACHED_MAX: usize = 128;

/// How the daemon opens its SQLite databases.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// A named SQLite VFS (the simulator's disk), or `None` for SQLite's default.
    pub vfs: Option<String>,
    /// WAL pages after which a commit of control.db checkpoints into the database file
    /// (SQLite's default is 1000; the simulator checkpoints far more often, to crash inside
    /// checkpoints).
    pub wal_autocheckpoint_pages: u32,
    /// Commits of a sync index between its checkpoints. A sync index does not checkpoint
    /// automatically: its projection commits are not fsynced, and SQLite ignores a failure of
    /// an automatic checkpoint, whose failed WAL fsync would leave a hole that silently drops
    /// every later (durable) commit at the next recovery. Its own checkpoints report failure.
    pub index_checkpoint_commits: u32,
    /// Sync receipts a sync index keeps, newest first: one is written per page served, and a
    /// receipt matters only until its page is confirmed or read again. Confirming an evicted
    /// one is refused `receipt_unknown`, and the reader syncs again.
    pub receipts_kept_max: u64,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            vfs: None,
            wal_autocheckpoint_pages: 1000,
            index_checkpoint_commits: 64,
            receipts_kept_max: 100_000,
        }
    }
}

/// Receipts written between two evictions of the oldest (at most `receipts_kept_max`).
const RECEIPTS_EVICT_EVERY: u64 = 1024;

/// SQLite's count of commits by other connections (`PRAGMA data_version`): the external half
/// of a change stamp.
pub(crate) fn data_version(conn: &Connection) -> Result<u64> {
    Ok(conn
        .prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get::<_, i64>(0))? as u64)
}

/// Open a database the daemon owns alone, configured and migrated.
pub fn open_owned(path: &Path, cfg: &SqliteConfig, migrations: &[&str]) -> Result<Connection> {
    let mut conn = match &cfg.vfs {
        Some(v) => {
            Connection::open_with_flags_and_vfs(path, rusqlite::OpenFlags::default(), v.as_str())?
        }
        None => Connection::open(path)?,
    };
    configure_owned(&conn)?;
    // rusqlite keeps 16 prepared statements by default; the index alone has more, and an
    // evicted one is parsed and planned again on its next use
    conn.set_prepared_statement_cache_capacity(STATEMENTS_CACHED_MAX);
    let pages: i64 = conn.pragma_update_and_check(
        None,
        "wal_autocheckpoint",
        cfg.wal_autocheckpoint_pages,
        |r| r.get(0),
    )?;
    if pages != i64::from(cfg.wal_autocheckpoint_pages) {
        return Err(StoreError::Pragma(format!(
            "pragma wal_autocheckpoint reads back as {pages}; refusing to run"
        )));
    }
    migrate(&mut conn, migrations)?;
    Ok(conn)
}

/// The daemon owns its databases alone (it holds the state dir lock): exclusive locking spares
/// a file-lock round trip per statement. Then the four pragmas, read back.
fn configure_owned(conn: &Connection) -> Result<()> {
    let mode: String =
        conn.pragma_update_and_check(None, "locking_mode", "EXCLUSIVE", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("exclusive") {
        return Err(StoreError::Pragma(format!(
            "pragma locking_mode reads back as {mode}; refusing to run"
        )));
    }
    configure(conn)
}

/// Set the four pragmas and read each back, and pin query plans.
pub fn configure(conn: &Connection) -> Result<()> {
    // SQLite 3.5x re-plans a statement whenever a bound LIMIT or range value changes, which cost
    // a full re-prepare on most sync pages; our plans ride fixed indexes, so keep them stable.
    let qpsg = conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    if !qpsg {
        return Err(StoreError::Pragma(
            "the query planner stability guarantee does not hold; refusing to run".into(),
        ));
    }
    conn.pragma_update(None, "busy_timeout", 5000)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    let sync: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    let fk: i64 = conn.pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
    let busy: i64 = conn.pragma_query_value(None, "busy_timeout", |r| r.get(0))?;
    let checks = [
        (
            "journal_mode",
            mode.eq_ignore_ascii_case("wal"),
            mode.clone(),
        ),
        ("synchronous", sync == 2, sync.to_string()),
        ("foreign_keys", fk == 1, fk.to_string()),
        ("busy_timeout", busy == 5000, busy.to_string()),
    ];
    for (name, ok, got) in checks {
        if !ok {
            return Err(StoreError::Pragma(format!(
                "pragma {name} reads back as {got}; refusing to run"
            )));
        }
    }
    Ok(())
}

/// Apply pending migrations from `list`, each in its own transaction.
pub fn migrate(conn: &mut Connection, list: &[&str]) -> Result<()> {
    let applied: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if applied as usize > list.len() {
        return Err(StoreError::Corrupt(format!(
            "database schema version {applied} is newer than this build ({})",
            list.len()
        )));
    }
    for (i, sql) in list.iter().enumerate().skip(applied as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

const LIFECYCLE_COLS: &str = "agent, task, state, began_seq, began_ms, ttl_ms, lapsed";

fn lifecycle_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<LifecycleRow> {
    Ok(LifecycleRow {
        agent: r.get(0)?,
        task: r.get(1)?,
        state: r.get(2)?,
        began_seq: r.get::<_, i64>(3)? as u64,
        began_ms: r.get::<_, i64>(4)? as u64,
        ttl_ms: r.get::<_, i64>(5)? as u64,
        lapsed: r.get::<_, i64>(6)? != 0,
    })
}

fn event_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
    Ok(EventRow {
        seq: r.get::<_, i64>(0)? as u64,
        id: r.get(1)?,
        kind: r.get(2)?,
        actor: r.get(3)?,
        hlc_ms: r.get::<_, i64>(4)? as u64,
        hlc_c: r.get::<_, i64>(5)? as u32,
        hash: r.get(6)?,
        task: r.get(7)?,
        body: r.get(8)?,
    })
}

const EVENT_COLS: &str = "seq, id, kind, actor, hlc_ms, hlc_c, hash, task, body";
const ITEM_COLS: &str =
    "id, source, source_seq, agent, from_agent, task, status, resolved_by, not_after_ms";

fn item_from_row(kind: ItemKind, r: &rusqlite::Row<'_>) -> rusqlite::Result<ItemRow> {
    Ok(ItemRow {
        kind,
        id: r.get(0)?,
        source: r.get(1)?,
        source_seq: r.get::<_, i64>(2)? as u64,
        agent: r.get(3)?,
        from_agent: r.get(4)?,
        task: r.get(5)?,
        status: r.get(6)?,
        resolved_by: r.get(7)?,
        not_after_ms: r.get::<_, Option<i64>>(8)?.map(|v| v as u64),
    })
}

fn checkpoint_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CheckpointRow> {
    Ok(CheckpointRow {
        actor: r.get(0)?,
        conversation: r.get(1)?,
        conversation_key: r.get(2)?,
        view_gen: r.get(3)?,
        confirmed_seq: r.get::<_, i64>(4)? as u64,
        chunk_seq: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
        chunk_offset: r.get::<_, i64>(6)? as u64,
        updated_ms: r.get::<_, i64>(7)? as u64,
    })
}

fn upsert_checkpoint(conn: &Connection, c: &CheckpointRow) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO checkpoints (actor, conversation, conversation_key, view_gen, confirmed_seq, chunk_seq, chunk_offset, updated_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT(actor, conversation) DO UPDATE SET conversation_key = ?3, view_gen = ?4,
           confirmed_seq = ?5, chunk_seq = ?6, chunk_offset = ?7, updated_ms = ?8",
    )?
    .execute(params![
            c.actor,
            c.conversation,
            c.conversation_key,
            c.view_gen,
            c.confirmed_seq as i64,
            c.chunk_seq.map(|v| v as i64),
            c.chunk_offset as i64,
            c.updated_ms as i64
        ],
    )?;
    Ok(())
}

impl Index {
    pub fn open(path: &Path) -> Result<Index> {
        Index::open_with(path, &SqliteConfig::default())
    }

    pub fn open_with(path: &Path, cfg: &SqliteConfig) -> Result<Index> {
        let manual = SqliteConfig {
            wal_autocheckpoint_pages: 0,
            ..cfg.clone()
        };
        let conn = open_owned(path, &manual, MIGRATIONS)?;
        Ok(Index {
            conn,
            in_txn: false,
            sync_full: true,
            pending: 0,
            pending_mark: None,
            broken: None,
            commits: 0,
            checkpoint_commits: cfg.index_checkpoint_commits.max(1),
            receipts_kept_max: cfg.receipts_kept_max.max(1),
            writes: 0,
        })
    }

    /// Copy the WAL into the database file (and fsync both), reporting any failure: after a
    /// failed fsync the WAL may have a hole, so the index is broken until a restart.
    fn checkpoint_wal(&mut self) -> Result<()> {
        debug_assert!(!self.in_txn, "checkpoints run between transactions");
        let done = self
            .conn
            .prepare_cached("PRAGMA wal_checkpoint(PASSIVE)")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)));
        self.commits = 0;
        match done {
            Ok(_) => Ok(()),
            Err(e) => {
                self.broken = Some(format!("checkpoint failed: {e}"));
                Err(e.into())
            }
        }
    }

    fn begin(&mut self) -> Result<()> {
        self.writes += 1;
        if !self.in_txn {
            self.set_sync_full(false)?;
            self.run("BEGIN IMMEDIATE")?;
            self.in_txn = true;
        }
        Ok(())
    }

    /// One transaction-control statement, prepared once: they run several times per call.
    fn run(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([]).map(|_| ())
    }

    /// SQLite refuses to change the mode inside a transaction: only called outside one.
    fn set_sync_full(&mut self, full: bool) -> Result<()> {
        debug_assert!(!self.in_txn, "synchronous changes outside a transaction");
        if self.sync_full != full {
            let mode = if full { "FULL" } else { "NORMAL" };
            self.conn
                .prepare_cached(&format!("PRAGMA synchronous = {mode}"))?
                .execute([])?;
            self.sync_full = full;
        }
        Ok(())
    }

    /// Run `f` in a transaction of its own that commits at synchronous=FULL, after committing
    /// what is pending: state that is not in the journal (a confirmation and the checkpoint it
    /// establishes) is durable before it is acknowledged. The WAL fsync covers every earlier
    /// commit too.
    fn durable(&mut self, f: impl FnOnce(&Connection) -> rusqlite::Result<()>) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(StoreError::Io(std::io::Error::other(format!(
                "the sync index is broken until a restart: {why}"
            ))));
        }
        self.flush()?;
        self.writes += 1;
        self.set_sync_full(true)?;
        self.run("BEGIN IMMEDIATE")?;
        self.in_txn = true;
        // SQLite writes nothing (and so syncs nothing) for a transaction whose rows are byte for
        // byte what they were: a counter makes sure this one has a page to commit and fsync.
        let written = f(&self.conn).and_then(|()| {
            self.run(
                "INSERT INTO meta (key, value) VALUES ('durable_commits', '1')
                 ON CONFLICT(key) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)",
            )
        });
        if let Err(e) = written {
            let _ = self.run("ROLLBACK");
            self.in_txn = false;
            return Err(e.into());
        }
        // no checkpoint here: its failure must not turn a durable commit into a refusal
        self.commit_open()
    }

    /// Commit the open transaction, if any, at the connection's current synchronous mode.
    fn commit_open(&mut self) -> Result<()> {
        if self.in_txn {
            if let Err(e) = self.write_pending_mark().and_then(|()| self.run("COMMIT")) {
                let _ = self.run("ROLLBACK");
                self.in_txn = false;
                self.broken = Some(format!("commit failed: {e}"));
                self.pending = 0;
                return Err(e.into());
            }
            self.in_txn = false;
            self.pending = 0;
            self.commits += 1;
        }
        Ok(())
    }

    fn abort(&mut self) {
        self.pending_mark = None;
        if self.in_txn {
            let _ = self.run("ROLLBACK");
            self.in_txn = false;
            if self.pending > 0 {
                self.broken = Some(format!(
                    "{} pending projection batches were rolled back",
                    self.pending
                ));
            }
            self.pending = 0;
        }
    }

    /// Run `f` inside a savepoint of the open transaction: its failure undoes only its own
    /// statements, never the projection rows pending beside it.
    fn isolated(&mut self, f: impl FnOnce(&Connection) -> rusqlite::Result<()>) -> Result<()> {
        self.begin()?;
        self.run("SAVEPOINT isolated")?;
        match f(&self.conn) {
            Ok(()) => {
                self.run("RELEASE isolated")?;
                Ok(())
            }
            Err(e) => {
                if self
                    .conn
                    .execute_batch("ROLLBACK TO isolated; RELEASE isolated")
                    .is_err()
                {
                    self.abort();
                }
                Err(e.into())
            }
        }
    }

    fn apply_rows(tx: &Connection, b: &Batch) -> Result<()> {
        {
            let mut ins = tx.prepare_cached(&format!(
                // `"audience"` appears in a body's text only as that key or as a value of
                // exactly that word (a quote inside a string is escaped): the scan spares the
                // parse of every other body
                "INSERT OR IGNORE INTO events ({EVENT_COLS}, audience) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,
                    CASE WHEN instr(?9, '\"audience\"') > 0 THEN json_extract(?9, '$.audience') END)"
            ))?;
            let mut fts = tx.prepare_cached(&format!(
                "INSERT INTO events_fts(rowid, text) SELECT ?1, t FROM (SELECT {FTS_TEXT} AS t) WHERE t IS NOT NULL"
            ))?;
            for e in &b.events {
                let added = ins.execute(params![
                    e.seq as i64,
                    e.id,
                    e.kind,
                    e.actor,
                    e.hlc_ms as i64,
                    e.hlc_c as i64,
                    e.hash,
                    e.task,
                    e.body
                ])?;
                // a replayed event is in the search index already
                if added == 1 {
                    fts.execute(params![e.seq as i64, e.body])?;
                }
            }
            let mut edge = tx.prepare_cached(
                "INSERT OR IGNORE INTO causal_edges (child, parent) VALUES (?1, ?2)",
            )?;
            for (c, p) in &b.edges {
                edge.execute(params![c, p])?;
            }
            for it in &b.items {
                tx.prepare_cached(&format!(
                    "INSERT OR IGNORE INTO {} ({ITEM_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    it.kind.table()
                ))?
                .execute(params![
                    it.id,
                    it.source,
                    it.source_seq as i64,
                    it.agent,
                    it.from_agent,
                    it.task,
                    it.status,
                    it.resolved_by,
                    it.not_after_ms.map(|v| v as i64)
                ])?;
            }
            for (kind, id, status, by) in &b.resolutions {
                tx.prepare_cached(&format!(
                    "UPDATE {} SET status = ?2, resolved_by = ?3 WHERE id = ?1 AND status = 'open'",
                    kind.table()
                ))?
                .execute(params![id, status, by])?;
            }
            for c in &b.checkpoints {
                upsert_checkpoint(tx, c)?;
            }
            for f in &b.folds {
                tx.prepare_cached(
                    "UPDATE checkpoints SET confirmed_seq = ?4, chunk_seq = NULL, chunk_offset = 0
                     WHERE actor = ?1 AND conversation_key = ?2 AND view_gen = ?3 AND confirmed_seq < ?4",
                )?
                .execute(params![f.actor, f.conversation_key, f.view_gen, f.seq as i64])?;
            }
            Self::apply_invariant_rows(tx, b)?;
        }
        Ok(())
    }

    /// Write the journal mark the open transaction moves to: once, just before it commits
    /// (every batch moves the mark; only the last one before a commit is ever seen).
    fn write_pending_mark(&mut self) -> rusqlite::Result<()> {
        let Some(m) = self.pending_mark.take() else {
            return Ok(());
        };
        let value = serde_json::to_string(&m).expect("a journal mark serializes");
        self.conn
            .prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('journal_mark', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = ?1",
            )?
            .execute([value])
            .map(|_| ())
    }

    fn apply_invariant_rows(tx: &Connection, b: &Batch) -> Result<()> {
        for (actor, key, event, seq, task) in &b.idempotency {
            // the newest use of a key wins, so a replay that meets a key reused after its
            // eviction ends where the live registry did
            tx.prepare_cached(
                "INSERT INTO idempotency (actor, key, event, seq, task) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(actor, key) DO UPDATE SET event = excluded.event, seq = excluded.seq,
                   task = excluded.task WHERE excluded.seq > idempotency.seq",
            )?
            .execute(params![actor, key, event, *seq as i64, task])?;
        }
        if !b.idempotency.is_empty() {
            tx.prepare_cached(
                "DELETE FROM idempotency WHERE seq < (SELECT seq FROM idempotency ORDER BY seq DESC LIMIT 1 OFFSET ?1)",
            )?
            .execute([(IDEMPOTENCY_KEYS_MAX - 1) as i64])?;
        }
        for c in &b.lifecycles {
            match c {
                LifecycleChange::Begin {
                    agent,
                    task,
                    seq,
                    at_ms,
                    ttl_ms,
                } => {
                    tx.prepare_cached(
                        "INSERT INTO lifecycles (agent, task, state, began_seq, began_ms, ttl_ms, lapsed)
                         VALUES (?1, ?2, 'begun', ?3, ?4, ?5, 0)
                         ON CONFLICT(agent, task) DO UPDATE SET state = 'begun', began_seq = ?3,
                           began_ms = ?4, ttl_ms = ?5, lapsed = 0",
                    )?
                    .execute(params![agent, task, *seq as i64, *at_ms as i64, *ttl_ms as i64])?;
                }
                LifecycleChange::Resolve { task } => {
                    tx.prepare_cached(
                        "UPDATE lifecycles SET state = 'resolved' WHERE task = ?1 AND state = 'begun'",
                    )?
                    .execute([task])?;
                }
                LifecycleChange::Lapsed { agent, task } => {
                    tx.prepare_cached(
                        "UPDATE lifecycles SET lapsed = 1 WHERE agent = ?1 AND task = ?2",
                    )?
                    .execute([agent, task])?;
                }
            }
        }
        for a in &b.artifacts {
            // a replay projects the same version again: the first stays
            tx.prepare_cached(&format!(
                "INSERT OR IGNORE INTO artifacts ({ARTIFACT_COLS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            ))?
            .execute(params![
                a.kind,
                a.key,
                a.version,
                a.sha256,
                a.bytes as i64,
                a.producer,
                serde_json::to_string(&a.parents).expect("parents serialize"),
                a.event,
                a.seq as i64,
                a.hlc_ms as i64,
                serde_json::to_string(&a.audience).expect("audience serializes"),
                a.task,
            ])?;
        }
        for e in &b.evidence {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO evidence (id, agent, task, req, origin, lineage, event, seq, sha256)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                e.id,
                e.agent,
                e.task,
                e.req,
                e.origin,
                serde_json::to_string(&e.lineage).expect("lineage serializes"),
                e.event,
                e.seq as i64,
                e.sha256
            ])?;
        }
        for c in &b.ops {
            match c {
                OpChange::Begin(o) => {
                    tx.prepare_cached(
                        "INSERT OR IGNORE INTO ops (id, agent, task, destination, parent, state, outcome, probe, began_seq, began_ms, ttl_ms, lapsed)
                         VALUES (?1, ?2, ?3, ?4, ?5, 'begun', NULL, ?6, ?7, ?8, ?9, 0)",
                    )?
                    .execute(params![o.id, o.agent, o.task, o.destination, o.parent, o.probe,
                        o.began_seq as i64, o.began_ms as i64, o.ttl_ms as i64])?;
                }
                OpChange::Effect { id } => {
                    tx.prepare_cached(
                        "UPDATE ops SET state = 'effected' WHERE id = ?1 AND state = 'begun'",
                    )?
                    .execute([id])?;
                }
                OpChange::Resolve { id, outcome } => {
                    tx.prepare_cached(
                        "UPDATE ops SET state = 'resolved', outcome = ?2 WHERE id = ?1 AND state != 'resolved'",
                    )?
                    .execute([id, outcome])?;
                }
                OpChange::Lapsed { id } => {
                    tx.prepare_cached("UPDATE ops SET lapsed = 1 WHERE id = ?1")?
                        .execute([id])?;
                }
            }
        }
        Ok(())
    }

    /// The mentions and obligations `filter` (a WHERE clause and what follows it) selects from
    /// each table, oldest first, mentions before obligations of the same source.
    fn items_where(&self, filter: &str, params: &[&dyn rusqlite::ToSql]) -> Result<Vec<ItemRow>> {
        let mut out = Vec::new();
        for kind in [ItemKind::Mention, ItemKind::Obligation] {
            let mut st = self.conn.prepare_cached(&format!(
                "SELECT {ITEM_COLS} FROM {} WHERE {filter}",
                kind.table()
            ))?;
            let rows = st.query_map(params, |r| item_from_row(kind, r))?;
            for r in rows {
                out.push(r?);
            }
        }
        out.sort_by_key(|i| i.source_seq);
        Ok(out)
    }
}

impl RoomIndex for Index {
    fn change_stamp(&self) -> Result<ChangeStamp> {
        Ok(ChangeStamp {
            external: data_version(&self.conn)?,
            local: self.writes,
        })
    }

    /// The seq up to which every wake permit the journal implies is known durable (0: none).
    fn wakes_mark(&self) -> Result<u64> {
        let v: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'wakes_mark'", [], |r| {
                r.get(0)
            })
            .optional()?;
        v.map_or(Ok(0), |s| {
            s.parse()
                .map_err(|e| StoreError::Corrupt(format!("wakes mark {s:?}: {e}")))
        })
    }

    /// Record that every permit up to `seq` is durable, and commit (with anything pending).
    fn set_wakes_mark(&mut self, seq: u64) -> Result<()> {
        self.begin()?;
        let set = self
            .conn
            .prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('wakes_mark', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = ?1",
            )
            .and_then(|mut st| st.execute([seq.to_string()]));
        if let Err(e) = set {
            self.abort();
            return Err(e.into());
        }
        self.pending += 1;
        self.flush()
    }

    /// Items records after `seq`, oldest first, at most `limit`: whose permits to re-derive.
    fn items_after(&self, seq: u64, limit: usize) -> Result<Vec<EventRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {EVENT_COLS} FROM events WHERE seq > ?1 AND kind = 'items' ORDER BY seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![seq as i64, limit as i64], event_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn trust(&self) -> Result<LogTrust> {
        let v: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'log_trust'", [], |r| {
                r.get(0)
            })
            .optional()?;
        v.map_or(Ok(LogTrust::default()), |s| {
            serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("log trust: {e}")))
        })
    }

    fn set_trust(&mut self, t: &LogTrust) -> Result<()> {
        let value = serde_json::to_string(t).expect("log trust serializes");
        self.durable(|c| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES ('log_trust', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = ?1",
                [value],
            )
            .map(|_| ())
        })
    }

    fn witnesses(&self, upto: u64) -> Result<IndexWitnesses> {
        witnesses_of(&self.conn, upto, self.pending_mark.as_ref())
    }

    fn mark(&self) -> Result<Option<JournalMark>> {
        if let Some(m) = &self.pending_mark {
            return Ok(Some(m.clone()));
        }
        let v: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'journal_mark'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        v.map(|s| {
            serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("journal mark: {e}")))
        })
        .transpose()
    }

    /// Commit whatever is pending. Transactions opened by `begin` run at synchronous=NORMAL:
    /// projection rows, receipts and marks, all of which the journal re-creates or a reader
    /// recovers from (DESIGN §10), so a crash may lose them and the next open catches the index
    /// up from the journal. Those opened by `durable` run at FULL.
    fn flush(&mut self) -> Result<()> {
        self.commit_open()?;
        if self.commits >= self.checkpoint_commits {
            self.checkpoint_wal()?;
        }
        Ok(())
    }

    /// Drop pending rows without committing them: what a crash does (simulation).
    fn discard_pending(&mut self) {
        self.abort();
    }

    /// Why the index can no longer be trusted in this process, if it cannot.
    fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Apply a batch and commit it (with anything pending) before returning.
    fn apply(&mut self, b: &Batch) -> Result<()> {
        self.apply_deferred(b)?;
        self.flush()
    }

    /// Apply a batch inside the open transaction; commit every `DEFERRED_BATCHES_MAX` batches.
    /// Reads on this connection see the rows at once. On error everything pending is rolled
    /// back (the caller must then treat the index as behind its journal).
    fn apply_deferred(&mut self, b: &Batch) -> Result<()> {
        self.begin()?;
        if let Err(e) = Self::apply_rows(&self.conn, b) {
            self.abort();
            return Err(e);
        }
        if let Some(m) = &b.mark {
            self.pending_mark = Some(m.clone());
        }
        self.pending += 1;
        if self.pending >= DEFERRED_BATCHES_MAX {
            self.flush()?;
        }
        Ok(())
    }

    /// `exactly_once`: the event (id, seq, task) that registered `key` for `actor`, if kept.
    fn idempotent(&self, actor: &str, key: &str) -> Result<Option<(String, u64, Option<String>)>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT event, seq, task FROM idempotency WHERE actor = ?1 AND key = ?2",
            )?
            .query_row([actor, key], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)? as u64, r.get(2)?))
            })
            .optional()?)
    }

    fn idempotency_keys(&self) -> Result<u64> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM idempotency", [], |r| {
                r.get::<_, i64>(0)
            })? as u64)
    }

    fn lifecycle(&self, agent: &str, task: &str) -> Result<Option<LifecycleRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {LIFECYCLE_COLS} FROM lifecycles WHERE agent = ?1 AND task = ?2"
            ))?
            .query_row([agent, task], lifecycle_from_row)
            .optional()?)
    }

    fn evidence(&self, id: &str) -> Result<Option<EvidenceRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {EVIDENCE_COLS} FROM evidence WHERE id = ?1"
            ))?
            .query_row([id], evidence_from_row)
            .optional()?)
    }

    fn artifact(&self, kind: &str, key: &str, version: Option<u32>) -> Result<Option<ArtifactRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {ARTIFACT_COLS} FROM artifacts WHERE kind = ?1 AND key = ?2
             AND (?3 IS NULL OR version = ?3) ORDER BY version DESC LIMIT 1"
        ))?;
        Ok(st
            .query_row(params![kind, key, version], artifact_from_row)
            .optional()?)
    }

    fn artifact_heads(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ArtifactRow>> {
        let (k, key) = after.unwrap_or(("", ""));
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {ARTIFACT_COLS} FROM artifacts a
             WHERE (kind, key) > (?1, ?2)
               AND version = (SELECT MAX(version) FROM artifacts b WHERE b.kind = a.kind AND b.key = a.key)
             ORDER BY kind, key LIMIT ?3"
        ))?;
        let rows = st.query_map(params![k, key, limit as i64], artifact_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn artifact_of_task(&self, task: &str, kind: &str, key: &str) -> Result<Option<ArtifactRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {ARTIFACT_COLS} FROM artifacts WHERE task = ?1 AND kind = ?2 AND key = ?3
             ORDER BY version DESC LIMIT 1"
        ))?;
        Ok(st
            .query_row(params![task, kind, key], artifact_from_row)
            .optional()?)
    }

    fn search(&self, query: &str, offset: usize, limit: usize) -> Result<Vec<(u64, f64)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT rowid, rank FROM events_fts WHERE events_fts MATCH ?1
             ORDER BY rank, rowid DESC LIMIT ?2 OFFSET ?3",
        )?;
        let rows = st.query_map(params![query, limit as i64, offset as i64], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, f64>(1)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn embedding_todo(
        &self,
        model: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String, String)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT e.seq, e.hash, COALESCE(json_extract(e.body, '$.text'),
                    json_extract(e.body, '$.text_blob.preview'),
                    json_extract(e.body, '$.created.title')) AS t
             FROM events e
             WHERE e.seq > ?2 AND t IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM embeddings m
                               WHERE m.model = ?1 AND m.seq = e.seq AND m.hash = e.hash)
             ORDER BY e.seq LIMIT ?3",
        )?;
        let rows = st.query_map(params![model, after as i64, limit as i64], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn put_embeddings(&mut self, model: &str, rows: &[(u64, String, Vec<i8>)]) -> Result<()> {
        self.isolated(|conn| {
            let mut st = conn.prepare_cached(
                "INSERT OR REPLACE INTO embeddings (seq, model, hash, vector) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (seq, hash, v) in rows {
                let bytes: Vec<u8> = v.iter().map(|x| *x as u8).collect();
                st.execute(params![*seq as i64, model, hash, bytes])?;
            }
            Ok(())
        })
    }

    fn embeddings(&self, model: &str, before: u64, limit: usize) -> Result<Vec<(u64, Vec<i8>)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT m.seq, m.vector FROM embeddings m JOIN events e ON e.seq = m.seq AND e.hash = m.hash
             WHERE m.model = ?1 AND m.seq < ?2 ORDER BY m.seq DESC LIMIT ?3",
        )?;
        let before = i64::try_from(before).unwrap_or(i64::MAX);
        let rows = st.query_map(params![model, before, limit as i64], |r| {
            let bytes: Vec<u8> = r.get(1)?;
            Ok((
                r.get::<_, i64>(0)? as u64,
                bytes.into_iter().map(|b| b as i8).collect(),
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn embedding_counts(&self, model: &str) -> Result<(u64, u64)> {
        let embedded: i64 = self
            .conn
            .prepare_cached(
                "SELECT COUNT(*) FROM embeddings m JOIN events e ON e.seq = m.seq AND e.hash = m.hash
                 WHERE m.model = ?1",
            )?
            .query_row([model], |r| r.get(0))?;
        let with_text: i64 = self
            .conn
            .prepare_cached(
                "SELECT COUNT(*) FROM events WHERE COALESCE(json_extract(body, '$.text'),
                    json_extract(body, '$.text_blob.preview'),
                    json_extract(body, '$.created.title')) IS NOT NULL",
            )?
            .query_row([], |r| r.get(0))?;
        Ok((embedded as u64, with_text as u64))
    }

    fn artifact_keys(&self) -> Result<u64> {
        Ok(self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM (SELECT DISTINCT kind, key FROM artifacts)")?
            .query_row([], |r| r.get::<_, i64>(0))? as u64)
    }

    fn evidence_of_task(&self, task: &str, limit: usize) -> Result<Vec<EvidenceRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {EVIDENCE_COLS} FROM evidence WHERE task = ?1 ORDER BY seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![task, limit as i64], evidence_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn evidence_for(&self, task: &str, req: &str, limit: usize) -> Result<Vec<EvidenceRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {EVIDENCE_COLS} FROM evidence WHERE task = ?1 AND req = ?2 ORDER BY seq LIMIT ?3"
        ))?;
        let rows = st.query_map(params![task, req, limit as i64], evidence_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn op(&self, id: &str) -> Result<Option<OpRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {OP_COLS} FROM ops WHERE id = ?1"))?
            .query_row([id], op_from_row)
            .optional()?)
    }

    fn ops_of_task(&self, task: &str, limit: usize) -> Result<Vec<OpRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OP_COLS} FROM ops WHERE task = ?1 ORDER BY began_seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![task, limit as i64], op_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn ops_unresolved(&self, limit: usize) -> Result<Vec<OpRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OP_COLS} FROM ops WHERE state != 'resolved' ORDER BY began_seq LIMIT ?1"
        ))?;
        let rows = st.query_map(params![limit as i64], op_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// `resolution` for operations: unresolved past their TTL, not yet recorded in doubt.
    fn lapsed_ops(&self, now_ms: u64, limit: usize) -> Result<Vec<OpRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {OP_COLS} FROM ops
             WHERE state != 'resolved' AND lapsed = 0 AND began_ms + ttl_ms <= ?1
             ORDER BY began_seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![now_ms as i64, limit as i64], op_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// `resolution`: begun lifecycles whose TTL ran out at `now_ms` and that are not yet
    /// recorded as lapsed, oldest first, at most `limit`.
    fn lapsed_begins(&self, now_ms: u64, limit: usize) -> Result<Vec<LifecycleRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {LIFECYCLE_COLS} FROM lifecycles
             WHERE state = 'begun' AND lapsed = 0 AND began_ms + ttl_ms <= ?1
             ORDER BY began_seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![now_ms as i64, limit as i64], lifecycle_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Drop the projection (not receipts or checkpoints) so it can be refilled from the journal.
    fn clear_projection(&mut self) -> Result<()> {
        self.flush()?;
        // the owner is told the rebuild began from nothing: that must survive a crash
        self.set_sync_full(true)?;
        let tx = self.conn.transaction()?;
        for t in PROJECTION_TABLES {
            tx.execute(&format!("DELETE FROM {t}"), [])?;
        }
        tx.execute(
            "INSERT INTO events_fts(events_fts) VALUES ('delete-all')",
            [],
        )?;
        tx.execute(
            "DELETE FROM meta WHERE key IN ('journal_mark', 'wakes_mark')",
            [],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn event_by_seq(&self, seq: u64) -> Result<Option<EventRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {EVENT_COLS} FROM events WHERE seq = ?1"))?
            .query_row([seq as i64], event_from_row)
            .optional()?)
    }

    fn event_by_id(&self, id: &str) -> Result<Option<EventRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {EVENT_COLS} FROM events WHERE id = ?1"))?
            .query_row([id], event_from_row)
            .optional()?)
    }

    /// Events with seq ≥ `from`, at most `limit`.
    fn events_from(&self, from: u64, limit: usize) -> Result<Vec<EventRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {EVENT_COLS} FROM events WHERE seq >= ?1 ORDER BY seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![from as i64, limit as i64], event_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn event_heads_from(&self, from: u64, limit: usize) -> Result<Vec<EventHead>> {
        let mut st = self.conn.prepare_cached(
            "SELECT seq, id, hash, audience FROM events WHERE seq >= ?1 ORDER BY seq LIMIT ?2",
        )?;
        let rows = st.query_map(params![from as i64, limit as i64], |r| {
            Ok((
                EventHead {
                    seq: r.get::<_, i64>(0)? as u64,
                    id: r.get(1)?,
                    hash: r.get(2)?,
                    audience: Vec::new(),
                },
                r.get::<_, Option<String>>(3)?,
            ))
        })?;
        let mut heads = Vec::new();
        for row in rows {
            let (mut head, audience) = row?;
            if let Some(a) = audience {
                head.audience = serde_json::from_str(&a).map_err(|e| {
                    StoreError::Corrupt(format!(
                        "event {}: audience is not a list of names: {e}",
                        head.seq
                    ))
                })?;
            }
            heads.push(head);
        }
        Ok(heads)
    }

    /// The first event after `seq` whose actor is not `actor` and that `actor` reads (one
    /// withheld from it is never owed). Invariant verdicts are evidence about acts, not acts:
    /// they do not hold anyone at the gate (else one agent repeating a refused call would stall
    /// every room-mate).
    fn first_foreign_after(&self, seq: u64, actor: &str) -> Result<Option<u64>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT seq FROM events WHERE seq > ?1 AND actor != ?2 AND kind != 'invariant_violation'
                 AND (audience IS NULL
                      OR COALESCE(json_array_length(audience), 0) = 0
                      OR EXISTS (SELECT 1 FROM json_each(audience) WHERE value = ?2))
                 ORDER BY seq LIMIT 1",
            )?
            .query_row(params![seq as i64, actor], |r| r.get::<_, i64>(0))
            .optional()?
            .map(|v| v as u64))
    }

    fn task_events(&self, task: &str, after_seq: u64, limit: usize) -> Result<Vec<EventRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {EVENT_COLS} FROM events WHERE task = ?1 AND kind = 'task' AND seq > ?2
             ORDER BY seq LIMIT ?3"
        ))?;
        let rows = st.query_map(
            params![task, after_seq as i64, limit as i64],
            event_from_row,
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn task_records(&self, task: &str, after_seq: u64, limit: usize) -> Result<Vec<EventRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {EVENT_COLS} FROM events WHERE task = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
        ))?;
        let rows = st.query_map(
            params![task, after_seq as i64, limit as i64],
            event_from_row,
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn citing(&self, parent: &str, limit: usize) -> Result<Vec<EventRow>> {
        let cols = EVENT_COLS
            .split(", ")
            .map(|c| format!("e.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {cols} FROM causal_edges c JOIN events e ON e.id = c.child
             WHERE c.parent = ?1 ORDER BY e.seq LIMIT ?2"
        ))?;
        let rows = st.query_map(params![parent, limit as i64], event_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn checkpoints_of(&self, actor: &str, limit: usize) -> Result<Vec<CheckpointRow>> {
        let mut st = self.conn.prepare_cached(
            "SELECT actor, conversation, conversation_key, view_gen, confirmed_seq, chunk_seq, chunk_offset, updated_ms
             FROM checkpoints WHERE actor = ?1 ORDER BY confirmed_seq DESC LIMIT ?2",
        )?;
        let rows = st.query_map(params![actor, limit as i64], checkpoint_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn event_count(&self) -> Result<u64> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))?
            as u64)
    }

    /// The oldest `limit` open items addressed to `agent`, and how many are open in all: what a
    /// sync page lists, without loading every open item.
    fn open_items_page(&self, agent: &str, limit: usize) -> Result<(Vec<ItemRow>, u64)> {
        let mut out = self.items_where(
            "agent = ?1 AND status = 'open' ORDER BY source_seq LIMIT ?2",
            params![agent, limit as i64],
        )?;
        out.truncate(limit);
        let total: i64 = self
            .conn
            .prepare_cached("SELECT coalesce(sum(n), 0) FROM open_counts WHERE agent = ?1")?
            .query_row([agent], |r| r.get(0))?;
        if total < out.len() as i64 {
            return Err(StoreError::Corrupt(format!(
                "open_counts says {total} open items for {agent} but {} are listed",
                out.len()
            )));
        }
        Ok((out, total as u64))
    }

    /// The sources of the open items addressed to `agent`, oldest first, at most `limit` of
    /// them: an item's id is derived from its source and addressee, so each source holds at most
    /// one item of each kind for one agent and `limit` rows of each kind are enough.
    fn open_sources(&self, agent: &str, limit: usize) -> Result<Vec<String>> {
        let mut seen: Vec<(u64, String)> = Vec::new();
        for kind in [ItemKind::Mention, ItemKind::Obligation] {
            let mut st = self.conn.prepare_cached(&format!(
                "SELECT source, source_seq FROM {} WHERE agent = ?1 AND status = 'open' ORDER BY source_seq LIMIT ?2",
                kind.table()
            ))?;
            let rows = st.query_map(params![agent, limit as i64], |r| {
                Ok((r.get::<_, i64>(1)? as u64, r.get::<_, String>(0)?))
            })?;
            for r in rows {
                seen.push(r?);
            }
        }
        seen.sort();
        seen.dedup();
        seen.truncate(limit);
        Ok(seen.into_iter().map(|(_, s)| s).collect())
    }

    /// The room's open obligations, whoever they are addressed to, oldest first.
    fn open_obligations(&self, limit: usize) -> Result<Vec<ItemRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {ITEM_COLS} FROM obligations WHERE status = 'open' ORDER BY source_seq LIMIT ?1"
        ))?;
        let rows = st.query_map([limit as i64], |r| item_from_row(ItemKind::Obligation, r))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The open items addressed to `agent` for `task`, oldest first.
    fn open_items_for_task(&self, agent: &str, task: &str) -> Result<Vec<ItemRow>> {
        self.items_where(
            "agent = ?1 AND task = ?2 AND status = 'open'",
            params![agent, task],
        )
    }

    fn put_source_read(&mut self, r: &SourceReadRow) -> Result<()> {
        self.isolated(|conn| {
            conn.prepare_cached(
                "INSERT INTO source_reads (agent, conversation, task, path, sha256, from_byte, to_byte, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![r.agent, r.conversation, r.task, r.path, r.sha256,
                r.from_byte as i64, r.to_byte as i64, r.at_ms as i64])?;
            conn.prepare_cached(
                "DELETE FROM source_reads WHERE rowid IN (SELECT rowid FROM source_reads
                   WHERE agent = ?1 AND task = ?2 AND path = ?3
                   ORDER BY rowid DESC LIMIT -1 OFFSET ?4)",
            )?
            .execute(params![r.agent, r.task, r.path, SOURCE_READS_PER_PART_MAX as i64])?;
            Ok(())
        })
    }

    fn source_reads(
        &self,
        agent: &str,
        conversation: &str,
        task: &str,
        path: &str,
        sha256: &str,
        since_ms: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let mut st = self.conn.prepare_cached(
            "SELECT from_byte, to_byte FROM source_reads
             WHERE agent = ?1 AND task = ?2 AND path = ?3 AND conversation = ?4 AND sha256 = ?5
               AND at_ms >= ?6 ORDER BY rowid",
        )?;
        let rows = st.query_map(
            params![agent, task, path, conversation, sha256, since_ms as i64],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn open_items_of_task(&self, task: &str, limit: usize) -> Result<Vec<ItemRow>> {
        let mut all = self.items_where(
            "task = ?1 AND status = 'open' ORDER BY source_seq LIMIT ?2",
            params![task, limit as i64],
        )?;
        all.truncate(limit);
        Ok(all)
    }

    fn item(&self, kind: ItemKind, id: &str) -> Result<Option<ItemRow>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {ITEM_COLS} FROM {} WHERE id = ?1",
                kind.table()
            ))?
            .query_row([id], |r| item_from_row(kind, r))
            .optional()?)
    }

    /// Every item of a kind, for listings and audits.
    fn items(&self, kind: ItemKind) -> Result<Vec<ItemRow>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {ITEM_COLS} FROM {} ORDER BY source_seq, id",
            kind.table()
        ))?;
        let rows = st.query_map([], |r| item_from_row(kind, r))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn checkpoint(&self, actor: &str, conversation: &str) -> Result<Option<CheckpointRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT actor, conversation, conversation_key, view_gen, confirmed_seq, chunk_seq, chunk_offset, updated_ms
                 FROM checkpoints WHERE actor = ?1 AND conversation = ?2",
            )?
            .query_row([actor, conversation], checkpoint_from_row)
            .optional()?)
    }

    fn put_checkpoint(&mut self, c: &CheckpointRow) -> Result<()> {
        self.durable(|conn| upsert_checkpoint(conn, c))
    }

    fn put_receipt(&mut self, r: &ReceiptRow) -> Result<()> {
        self.isolated(|conn| {
            conn.prepare_cached(
            "INSERT INTO receipts (id, actor, conversation, conversation_key, view_gen, from_seq, from_offset, to_seq,
               chunk_seq, chunk_offset, tip_seq, tip_hash, delivered_sha256, created_ms, confirmed_ms, base, page_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?15, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?16, ?17)",
        )
        .and_then(|mut st| st.execute(params![
                r.id,
                r.actor,
                r.conversation,
                r.conversation_key,
                r.view_gen,
                r.from_seq as i64,
                r.to_seq as i64,
                r.chunk_seq.map(|v| v as i64),
                r.chunk_offset as i64,
                r.tip_seq as i64,
                r.tip_hash,
                r.delivered_sha256,
                r.created_ms as i64,
                r.confirmed_ms.map(|v| v as i64),
                r.from_offset as i64,
                r.base,
                r.page_bytes.map(|b| b as i64)
            ]))
            .map(|_| ())
        })?;
        let rowid = self.conn.last_insert_rowid() as u64;
        let keep = self.receipts_kept_max;
        if rowid > keep && rowid.is_multiple_of(RECEIPTS_EVICT_EVERY.min(keep)) {
            self.isolated(|conn| {
                conn.prepare_cached("DELETE FROM receipts WHERE rowid <= ?1")?
                    .execute([(rowid - keep) as i64])
                    .map(|_| ())
            })?;
        }
        // A receipt only names what was delivered; losing it in a crash makes its confirmation
        // fail with receipt_unknown and the reader syncs again. So it rides the open
        // transaction; the confirmation that trusts it commits durably.
        self.pending += 1;
        if self.pending >= DEFERRED_BATCHES_MAX {
            self.flush()?;
        }
        Ok(())
    }

    fn receipt(&self, id: &str) -> Result<Option<ReceiptRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT id, actor, conversation, conversation_key, view_gen, from_seq, to_seq, chunk_seq,
                   chunk_offset, tip_seq, tip_hash, delivered_sha256, created_ms, confirmed_ms, from_offset, base,
                   page_bytes
                 FROM receipts WHERE id = ?1",
            )?
            .query_row([id], |r| {
                Ok(ReceiptRow {
                    id: r.get(0)?,
                    actor: r.get(1)?,
                    conversation: r.get(2)?,
                    conversation_key: r.get(3)?,
                    view_gen: r.get(4)?,
                    from_seq: r.get::<_, i64>(5)? as u64,
                    to_seq: r.get::<_, i64>(6)? as u64,
                    chunk_seq: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                    chunk_offset: r.get::<_, i64>(8)? as u64,
                    tip_seq: r.get::<_, i64>(9)? as u64,
                    tip_hash: r.get(10)?,
                    delivered_sha256: r.get(11)?,
                    created_ms: r.get::<_, i64>(12)? as u64,
                    confirmed_ms: r.get::<_, Option<i64>>(13)?.map(|v| v as u64),
                    from_offset: r.get::<_, i64>(14)? as u64,
                    base: r.get(15)?,
                    page_bytes: r.get::<_, Option<i64>>(16)?.map(|v| v as u64),
                })
            })
            .optional()?)
    }

    /// Mark a receipt confirmed and store the checkpoint it establishes, atomically and durably.
    fn confirm(&mut self, receipt_id: &str, now_ms: u64, checkpoint: &CheckpointRow) -> Result<()> {
        self.durable(|conn| {
            conn.prepare_cached("UPDATE receipts SET confirmed_ms = ?2 WHERE id = ?1")
                .and_then(|mut st| st.execute(params![receipt_id, now_ms as i64]))
                .and_then(|_| upsert_checkpoint(conn, checkpoint))
        })
    }

    /// Audit path: every ancestor of `id` over `causal_edges`, up to `depth_max` links.
    fn ancestors(&self, id: &str, depth_max: u32) -> Result<Vec<String>> {
        let mut st = self.conn.prepare_cached(
            "WITH RECURSIVE anc(id, depth) AS (
                SELECT parent, 1 FROM causal_edges WHERE child = ?1
                UNION
                SELECT e.parent, anc.depth + 1 FROM causal_edges e JOIN anc ON e.child = anc.id
                WHERE anc.depth < ?2
             ) SELECT DISTINCT id FROM anc",
        )?;
        let rows = st.query_map(params![id, depth_max as i64], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn by `a` at `seq`, with id `e<seq>`.
    fn event_row(seq: u64) -> EventRow {
        EventRow {
            seq,
            id: format!("e{seq}"),
            kind: "turn".into(),
            actor: "a".into(),
            hlc_ms: seq,
            hlc_c: 0,
            hash: "h".into(),
            task: None,
            body: "{}".into(),
        }
    }

    #[test]
    fn pragmas_are_verified_and_migrations_idempotent() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sync_index.db");
        drop(Index::open(&p).unwrap());
        let idx = Index::open(&p).unwrap();
        let v: i64 = idx
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v as usize, MIGRATIONS.len());
    }

    #[test]
    fn a_reader_stopped_inside_an_event_takes_it_again_after_the_rendering_changed() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sync_index.db");
        let cp = |seq: u64, chunk: Option<u64>, offset: u64| CheckpointRow {
            actor: "a".into(),
            conversation: format!("c{seq}"),
            conversation_key: "k".into(),
            view_gen: "v".into(),
            confirmed_seq: seq,
            chunk_seq: chunk,
            chunk_offset: offset,
            updated_ms: 1,
        };
        {
            let mut idx = Index::open(&p).unwrap();
            idx.put_checkpoint(&cp(3, Some(4), 1_000)).unwrap();
            idx.put_checkpoint(&cp(7, None, 0)).unwrap();
        }
        // as an index the build before the rendering change left it
        let old = Connection::open(&p).unwrap();
        old.execute_batch(
            "ALTER TABLE events DROP COLUMN audience; DROP TABLE artifacts; DROP TABLE events_fts; DROP TABLE embeddings",
        )
        .unwrap();
        old.pragma_update(None, "user_version", (MIGRATIONS.len() - 5) as i64)
            .unwrap();
        drop(old);
        let idx = Index::open(&p).unwrap();
        assert_eq!(
            idx.checkpoint("a", "c3").unwrap().unwrap(),
            cp(3, None, 0),
            "back to the event's first byte, at the same seq"
        );
        assert_eq!(idx.checkpoint("a", "c7").unwrap().unwrap(), cp(7, None, 0));
    }

    /// An index from before the audience column takes each event's audience from its body
    /// when it is migrated, and one projected after reads it from the column: both pass the
    /// same events over for the same readers.
    #[test]
    fn the_audience_column_is_filled_from_bodies_by_the_migration_and_at_projection() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sync_index.db");
        let with_body = |seq: u64, actor: &str, body: &str| EventRow {
            actor: actor.into(),
            body: body.into(),
            ..event_row(seq)
        };
        let rows = |from: u64| {
            vec![
                with_body(from, "a", r#"{"audience":["b"],"text":"x"}"#),
                with_body(from + 1, "a", r#"{"text":"\"audience\" in a text"}"#),
                with_body(from + 2, "a", r#"{"audience":[],"text":"x"}"#),
                with_body(from + 3, "a", r#"{"audience":["c","d"],"text":"x"}"#),
            ]
        };
        let check = |idx: &Index, from: u64| {
            let heads = idx.event_heads_from(from, 16).unwrap();
            let audiences: Vec<Vec<String>> = heads.iter().map(|h| h.audience.clone()).collect();
            assert_eq!(
                audiences,
                vec![
                    vec!["b".to_string()],
                    vec![],
                    vec![],
                    vec!["c".to_string(), "d".to_string()]
                ]
            );
            assert_eq!(idx.first_foreign_after(from - 1, "b").unwrap(), Some(from));
            assert_eq!(
                idx.first_foreign_after(from - 1, "c").unwrap(),
                Some(from + 1)
            );
            assert_eq!(idx.first_foreign_after(from, "c").unwrap(), Some(from + 1));
            assert_eq!(idx.first_foreign_after(from + 2, "b").unwrap(), None);
            assert_eq!(
                idx.first_foreign_after(from + 2, "d").unwrap(),
                Some(from + 3)
            );
        };
        {
            let mut idx = Index::open(&p).unwrap();
            idx.apply(&Batch {
                events: rows(1),
                ..Default::default()
            })
            .unwrap();
        }
        // as an index the build before the column left it
        let old = Connection::open(&p).unwrap();
        old.execute_batch(
            "ALTER TABLE events DROP COLUMN audience; DROP TABLE artifacts; DROP TABLE events_fts; DROP TABLE embeddings",
        )
        .unwrap();
        old.pragma_update(None, "user_version", (MIGRATIONS.len() - 4) as i64)
            .unwrap();
        drop(old);
        let mut idx = Index::open(&p).unwrap();
        check(&idx, 1);
        idx.apply(&Batch {
            events: rows(5),
            ..Default::default()
        })
        .unwrap();
        check(&idx, 5);
    }

    /// The journal mark rides the open transaction: read back at once on this connection, on
    /// disk only with the commit, gone with a rollback; a reopen sees the last committed one.
    #[test]
    fn the_journal_mark_is_written_with_its_commit() {
        use crate::journal::{Anchor, JournalMark};
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sync_index.db");
        let mark = |len: u64| JournalMark {
            dev: 1,
            ino: 2,
            len,
            anchor_sha256: Anchor::of_tail(&len.to_le_bytes()),
            tip_seq: len,
            tip_hash: "h".repeat(64),
            tip_hlc: room_core::Hlc { ms: len, c: 0 },
        };
        let batch = |len: u64| Batch {
            mark: Some(mark(len)),
            ..Default::default()
        };
        let stored = |idx: &Index| {
            idx.conn
                .query_row(
                    "SELECT value FROM meta WHERE key = 'journal_mark'",
                    [],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .unwrap()
        };
        let mut idx = Index::open(&p).unwrap();
        idx.apply_deferred(&batch(10)).unwrap();
        idx.apply_deferred(&batch(20)).unwrap();
        assert_eq!(
            idx.mark().unwrap(),
            Some(mark(20)),
            "read back before the commit"
        );
        assert_eq!(idx.witnesses(0).unwrap().seqs[0].seq, 20);
        assert_eq!(stored(&idx), None, "not written before the commit");
        idx.flush().unwrap();
        let on_disk: JournalMark = serde_json::from_str(&stored(&idx).unwrap()).unwrap();
        assert_eq!(on_disk, mark(20));
        assert_eq!(
            on_disk.anchor_sha256.sha256(),
            room_core::sha256_hex(&20u64.to_le_bytes()),
            "the anchor is the digest of the tail it was taken from"
        );
        idx.apply_deferred(&batch(30)).unwrap();
        idx.discard_pending();
        assert_eq!(
            idx.mark().unwrap(),
            Some(mark(20)),
            "a rollback drops its mark"
        );
        drop(idx);
        assert_eq!(Index::open(&p).unwrap().mark().unwrap(), Some(mark(20)));
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sync_index.db");
        drop(Index::open(&p).unwrap());
        Connection::open(&p)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        assert!(matches!(Index::open(&p), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn ancestors_walk_the_edges() {
        let t = tempfile::tempdir().unwrap();
        let mut idx = Index::open(&t.path().join("i.db")).unwrap();
        let batch = Batch {
            events: (1..=4).map(event_row).collect(),
            edges: vec![
                ("e2".into(), "e1".into()),
                ("e3".into(), "e2".into()),
                ("e4".into(), "e3".into()),
            ],
            ..Default::default()
        };
        idx.apply(&batch).unwrap();
        let mut a = idx.ancestors("e4", 16).unwrap();
        a.sort();
        assert_eq!(a, vec!["e1", "e2", "e3"]);
        assert_eq!(idx.ancestors("e4", 1).unwrap(), vec!["e3"]);
        assert_eq!(idx.first_foreign_after(0, "a").unwrap(), None);
        assert_eq!(idx.first_foreign_after(0, "b").unwrap(), Some(1));
    }

    /// The open-item totals the triggers keep match a count of the rows after inserts, a repeated
    /// insert, resolutions, a rolled-back batch and a projection rebuild.
    #[test]
    fn open_counts_follow_the_items() {
        let t = tempfile::tempdir().unwrap();
        let mut idx = Index::open(&t.path().join("i.db")).unwrap();
        let item = |kind, seq: u64, agent: &str| ItemRow {
            kind,
            id: format!("{kind:?}{seq}{agent}"),
            source: format!("e{seq}"),
            source_seq: seq,
            agent: agent.into(),
            from_agent: "a".into(),
            task: None,
            status: "open".into(),
            resolved_by: None,
            not_after_ms: None,
        };
        let counted = |idx: &Index, agent: &str| {
            let rows: i64 = ["mentions", "obligations"]
                .iter()
                .map(|t| {
                    idx.conn
                        .query_row(
                            &format!(
                                "SELECT count(*) FROM {t} WHERE agent = ?1 AND status = 'open'"
                            ),
                            [agent],
                            |r| r.get::<_, i64>(0),
                        )
                        .unwrap()
                })
                .sum();
            let (_, total) = idx.open_items_page(agent, 8).unwrap();
            assert_eq!(total as i64, rows, "{agent}");
            total
        };
        let mut items = vec![];
        for seq in 1..=6 {
            items.push(item(ItemKind::Mention, seq, "b"));
            items.push(item(ItemKind::Obligation, seq, "b"));
            items.push(item(ItemKind::Mention, seq, "c"));
        }
        let batch = Batch {
            events: (1..=6).map(event_row).collect(),
            items: items.clone(),
            ..Default::default()
        };
        idx.apply(&batch).unwrap();
        assert_eq!((counted(&idx, "b"), counted(&idx, "c")), (12, 6));
        // a replayed batch inserts nothing twice
        idx.apply(&batch).unwrap();
        assert_eq!(counted(&idx, "b"), 12);
        let resolve = |it: &ItemRow| (it.kind, it.id.clone(), "resolved".into(), "e6".into());
        idx.apply(&Batch {
            resolutions: vec![resolve(&items[0]), resolve(&items[1]), resolve(&items[0])],
            ..Default::default()
        })
        .unwrap();
        assert_eq!((counted(&idx, "b"), counted(&idx, "c")), (10, 6));
        // rolled back with the batch it rode in
        idx.apply_deferred(&Batch {
            resolutions: vec![resolve(&items[3])],
            ..Default::default()
        })
        .unwrap();
        idx.discard_pending();
        assert_eq!(counted(&idx, "b"), 10);
        idx.clear_projection().unwrap();
        assert_eq!((counted(&idx, "b"), counted(&idx, "c")), (0, 0));
    }

    /// A sync index keeps the newest `receipts_kept_max` receipts and evicts the oldest.
    #[test]
    fn the_oldest_receipts_are_evicted() {
        let t = tempfile::tempdir().unwrap();
        let cfg = SqliteConfig {
            receipts_kept_max: 10,
            ..SqliteConfig::default()
        };
        let mut idx = Index::open_with(&t.path().join("i.db"), &cfg).unwrap();
        let receipt = |n: u64| ReceiptRow {
            id: format!("rcpt_{n:032x}"),
            actor: "a".into(),
            conversation: "c".into(),
            conversation_key: "k".into(),
            view_gen: "v".into(),
            from_seq: 0,
            from_offset: 0,
            to_seq: n,
            chunk_seq: None,
            chunk_offset: 0,
            tip_seq: n,
            tip_hash: "h".into(),
            delivered_sha256: "d".into(),
            created_ms: n,
            confirmed_ms: None,
            base: None,
            page_bytes: None,
        };
        for n in 1..=35 {
            idx.put_receipt(&receipt(n)).unwrap();
        }
        idx.flush().unwrap();
        let kept: Vec<u64> = (1..=35)
            .filter(|n| idx.receipt(&receipt(*n).id).unwrap().is_some())
            .collect();
        // evicted at the 10th, 20th and 30th: the newest ten of those, and every one since
        assert_eq!(kept, (21..=35).collect::<Vec<_>>());
    }
}
